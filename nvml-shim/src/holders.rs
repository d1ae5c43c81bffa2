//! Processes that keep a MIG instance busy. The real driver answers NVML_ERROR_IN_USE to a
//! destroy while a client holds the instance (a CUDA process, DCGM, nvidia-smi); a process that
//! uses an instance holds its capability device (`/dev/nvidia-caps/nvidia-cap<minor>`) open,
//! which is also how an operator finds it (`fuser`, `lsof`). The stand-in has no driver to ask,
//! so holders register (`nvml-shim-ctl hold`) and a destroy checks that each still holds its
//! capability node open: an fd in `/proc/<pid>/fd` on that character device.

use crate::config::Config;
use crate::state::{Holder, State};

/// Whether process `pid` has a descriptor open on the character device `major:minor`.
pub fn holds(pid: u32, major: u32, minor: u32) -> bool {
    let want = rustix::fs::makedev(major, minor);
    let dir = format!("/proc/{pid}/fd");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return false;
    };
    rd.flatten().any(|e| {
        // stat follows the /proc magic link to the open file (an O_PATH descriptor included).
        rustix::fs::stat(e.path()).is_ok_and(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::CharacterDevice
                && st.st_rdev == want
        })
    })
}

/// Forgets holders that let go (exited, or closed the node).
pub fn prune(cfg: &Config, st: &mut State) {
    if !st.holders.is_empty() {
        st.holders.retain(|h| holds(h.pid, cfg.caps_major, h.minor));
    }
}

/// Whether a live holder keeps GPU instance `gi` of `gpu` (with `ci` None) or its compute
/// instance `ci` busy.
pub fn held(cfg: &Config, st: &mut State, gpu: u32, gi: u32, ci: Option<u32>) -> bool {
    prune(cfg, st);
    st.holders
        .iter()
        .any(|h: &Holder| h.gpu == gpu && h.gi == gi && (ci.is_none() || h.ci == ci))
}
