"""A private mount namespace for tests that need a small tmpfs of their own (a full disk, a
full /dev/shm), so that they run without root where the kernel allows it.

`unshare -m` needs CAP_SYS_ADMIN (root). Without it, an unprivileged user namespace
(`unshare --map-root-user --mount`) gives the process root's rights over its own mounts
only, which is enough to mount a tmpfs: Linux allows it unless the distribution turned
unprivileged user namespaces off (Debian's kernel.unprivileged_userns_clone = 0, Ubuntu's
kernel.apparmor_restrict_unprivileged_userns = 1, user.max_user_namespaces = 0) or a
seccomp filter (some container runtimes) refuses unshare(2).
"""

from __future__ import annotations

import functools
import shutil
import subprocess

# Tried in this order; the first under which a tmpfs can be mounted is used.
CANDIDATES = (["unshare", "--mount"], ["unshare", "--map-root-user", "--mount"])
# Mounts a 1 MiB tmpfs on /dev/shm in the new namespace (only it sees the mount).
_PROBE = ["sh", "-c", "mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs /dev/shm"]

_SYSCTLS = ("kernel/unprivileged_userns_clone", "user/max_user_namespaces",
            "kernel/apparmor_restrict_unprivileged_userns")


def _sysctls() -> str:
    seen = []
    for name in _SYSCTLS:
        try:
            with open(f"/proc/sys/{name}") as f:
                seen.append(f"{name.replace('/', '.')} = {f.read().strip()}")
        except OSError:
            pass
    return "; ".join(seen) or "none of " + ", ".join(s.replace("/", ".") for s in _SYSCTLS)


@functools.cache
def private_mount_prefix() -> tuple[tuple[str, ...] | None, str]:
    """(command prefix, "") for the first way that works here, or (None, why none does)."""
    if not shutil.which("unshare"):
        return None, "`unshare` (util-linux) is not installed"
    errors = []
    for prefix in CANDIDATES:
        try:
            r = subprocess.run([*prefix, *_PROBE], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            errors.append(f"`{' '.join(prefix)}`: {e}")
            continue
        if r.returncode == 0:
            return tuple(prefix), ""
        errors.append(f"`{' '.join(prefix)}`: {(r.stderr or r.stdout).strip() or r.returncode}")
    return None, ("cannot mount a tmpfs in a private mount namespace: " + "; ".join(errors) +
                  f" (sysctls: {_sysctls()})")
