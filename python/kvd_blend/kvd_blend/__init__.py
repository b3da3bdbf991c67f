"""kvd_blend: CacheBlend for vLLM with kvd. See docs/cacheblend.md.

    kvd_blend.connector   KvdBlendConnector (vLLM kv_connector_module_path)
    kvd_blend.model       blend-aware Llama/Qwen2/Qwen3 (registered by kvd_blend.plugin)
    kvd_blend.plan        the rows a request recomputes (pure)
    kvd_blend.config      kvd.blend.* settings
    kvd_blend.cpu_layout  K/V rows of vLLM-CPU's paged cache
"""
