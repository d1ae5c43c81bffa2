//! The processes that hold given device nodes open: what an operator would find with
//! `fuser -v /dev/nvidia-caps/*`. A GPU or compute instance that a process holds (a CUDA
//! context, DCGM, nvidia-smi) cannot be destroyed (NVML_ERROR_IN_USE), and each such process
//! holds the instance's capability node open; the epilog names them when a destroy stays in use.
//! Only that failure path pays for the scan (every descriptor of every process).

use std::os::unix::fs::MetadataExt;

/// A process with one of the devices open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// `/proc/<pid>/comm`.
    pub comm: String,
    pub uid: u32,
    /// The node as the process opened it (its /proc/<pid>/fd link).
    pub node: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} ({}, uid {}) has {} open",
            self.pid, self.comm, self.uid, self.node
        )
    }
}

/// Every process (readable under /proc) with a descriptor open on one of the character
/// devices `devices` ((major, minor) pairs), sorted by pid; a process is named once per node.
pub fn processes_holding(devices: &[(u32, u32)]) -> Vec<Holder> {
    let want: Vec<u64> = devices
        .iter()
        .map(|&(ma, mi)| rustix::fs::makedev(ma, mi))
        .collect();
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let mut nodes: Vec<String> = Vec::new();
        for fd in fds.flatten() {
            // metadata follows the /proc link to the open file itself.
            let Ok(m) = std::fs::metadata(fd.path()) else {
                continue;
            };
            if !std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type())
                || !want.contains(&m.rdev())
            {
                continue;
            }
            let node = std::fs::read_link(fd.path())
                .map(|l| l.display().to_string())
                .unwrap_or_else(|_| {
                    format!("c {}:{}", libc::major(m.rdev()), libc::minor(m.rdev()))
                });
            if !nodes.contains(&node) {
                nodes.push(node);
            }
        }
        if nodes.is_empty() {
            continue;
        }
        let comm = std::fs::read_to_string(p.path().join("comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        let uid = std::fs::metadata(p.path())
            .map(|m| m.uid())
            .unwrap_or(u32::MAX);
        for node in nodes {
            out.push(Holder {
                pid,
                comm: comm.clone(),
                uid,
                node,
            });
        }
    }
    out.sort_by(|a, b| (a.pid, &a.node).cmp(&(b.pid, &b.node)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device this process holds is found; one nobody holds is not.
    #[test]
    fn finds_this_process_holding_a_device() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let m = null.metadata().unwrap();
        let dev = (libc::major(m.rdev()), libc::minor(m.rdev()));
        let me = std::process::id();
        let found = processes_holding(&[dev]);
        let mine: Vec<&Holder> = found.iter().filter(|h| h.pid == me).collect();
        assert_eq!(mine.len(), 1, "{found:?}");
        assert_eq!(mine[0].node, "/dev/null");
        assert!(!mine[0].comm.is_empty());
        assert!(processes_holding(&[(4095, 1_000_000)]).is_empty());
        drop(null);
    }
}
