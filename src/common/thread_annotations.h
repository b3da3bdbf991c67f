// Clang thread-safety annotations. Every clang build compiles with -Wthread-safety
// -Werror=thread-safety (CMake option KVD_THREAD_SAFETY; in CI, the fuzz build of `make
// fuzz`): the compiler proves that every field marked KVD_GUARDED_BY(mu) is touched only with
// `mu` held and that every function marked KVD_REQUIRES(mu) is called with it held; a
// violation does not compile. Other compilers ignore the annotations.
#pragma once

#if defined(__clang__)
#define KVD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVD_THREAD_ANNOTATION(x)
#endif

#define KVD_CAPABILITY(x) KVD_THREAD_ANNOTATION(capability(x))
#define KVD_SCOPED_CAPABILITY KVD_THREAD_ANNOTATION(scoped_lockable)
#define KVD_GUARDED_BY(x) KVD_THREAD_ANNOTATION(guarded_by(x))
#define KVD_PT_GUARDED_BY(x) KVD_THREAD_ANNOTATION(pt_guarded_by(x))
#define KVD_ACQUIRED_BEFORE(...) KVD_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define KVD_ACQUIRED_AFTER(...) KVD_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define KVD_REQUIRES(...) KVD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define KVD_EXCLUDES(...) KVD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define KVD_ACQUIRE(...) KVD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define KVD_RELEASE(...) KVD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define KVD_ACQUIRE_SHARED(...) KVD_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define KVD_RELEASE_SHARED(...) KVD_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define KVD_REQUIRES_SHARED(...) KVD_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define KVD_TRY_ACQUIRE(...) KVD_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define KVD_ASSERT_CAPABILITY(x) KVD_THREAD_ANNOTATION(assert_capability(x))
#define KVD_RETURN_CAPABILITY(x) KVD_THREAD_ANNOTATION(lock_returned(x))
#define KVD_NO_THREAD_SAFETY_ANALYSIS KVD_THREAD_ANNOTATION(no_thread_safety_analysis)
