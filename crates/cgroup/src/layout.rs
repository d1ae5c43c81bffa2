//! Cgroup layout detection: where cgroup2 is mounted (pure v2 at /sys/fs/cgroup, hybrid at
//! /sys/fs/cgroup/unified), found by `statfs` on the job path, and the whole picture (v1
//! controllers, the v1 devices mount) from `/proc/self/mountinfo` where that is needed.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `statfs` magic of a cgroup2 file system.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Where nodes mount cgroup2: pure v2, then hybrid.
pub const STANDARD_V2_MOUNTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// Whether `path` is the root of a cgroup2 file system's mount (or any folder in one).
// f_type's integer type differs between architectures.
#[allow(clippy::unnecessary_cast)]
pub fn is_cgroup2(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|st| st.f_type as i64 == CGROUP2_SUPER_MAGIC)
}

/// The cgroup2 mount at one of the standard places, if there is one: two `statfs` calls, where
/// reading mountinfo would cost a prolog more than the rest of a layer's intent.
pub fn v2_mount() -> Option<PathBuf> {
    STANDARD_V2_MOUNTS
        .into_iter()
        .find(|p| is_cgroup2(Path::new(p)))
        .map(PathBuf::from)
}

/// The mount table could not be read.
#[derive(Debug)]
pub struct ReadError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot read {}: {}", self.path.display(), self.source)
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Default mount table.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// Kind of cgroup layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayoutKind {
    /// Only cgroup v1 hierarchies.
    Legacy,
    /// v1 controllers plus a cgroup2 mount (usually /sys/fs/cgroup/unified).
    Hybrid,
    /// Only cgroup2 (usually at /sys/fs/cgroup).
    Unified,
    /// No cgroup mounted at all.
    None,
}

/// What was detected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupLayout {
    pub kind: LayoutKind,
    /// Mount point of the v1 devices controller, if mounted.
    pub v1_devices: Option<PathBuf>,
    /// Mount point of cgroup2, if mounted (the first one).
    pub v2_root: Option<PathBuf>,
    /// v1 controllers mounted (names from the super options).
    pub v1_controllers: Vec<String>,
}

fn unescape(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let oct = std::str::from_utf8(oct).unwrap_or("");
                if let Ok(v) = u8::from_str_radix(oct, 8) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl CgroupLayout {
    /// Parse mountinfo text.
    pub fn parse(mountinfo: &str) -> CgroupLayout {
        let mut v1_devices = None;
        let mut v2_root = None;
        let mut v1_controllers = Vec::new();
        for line in mountinfo.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            if pre.len() < 5 || post.len() < 3 {
                continue;
            }
            let mnt = PathBuf::from(unescape(pre[4]));
            match post[0] {
                "cgroup2" if v2_root.is_none() => v2_root = Some(mnt),
                "cgroup" => {
                    for opt in post[2].split(',') {
                        let known = matches!(
                            opt,
                            "cpu"
                                | "cpuacct"
                                | "cpuset"
                                | "memory"
                                | "devices"
                                | "freezer"
                                | "net_cls"
                                | "blkio"
                                | "perf_event"
                                | "net_prio"
                                | "hugetlb"
                                | "pids"
                                | "rdma"
                                | "misc"
                        );
                        if known && !v1_controllers.iter().any(|c| c == opt) {
                            v1_controllers.push(opt.to_string());
                        }
                        if opt == "devices" && v1_devices.is_none() {
                            v1_devices = Some(mnt.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        let kind = match (v1_controllers.is_empty(), v2_root.is_some()) {
            (true, true) => LayoutKind::Unified,
            (false, true) => LayoutKind::Hybrid,
            (false, false) => LayoutKind::Legacy,
            (true, false) => LayoutKind::None,
        };
        CgroupLayout {
            kind,
            v1_devices,
            v2_root,
            v1_controllers,
        }
    }

    /// Detect from a mountinfo file (default [`MOUNTINFO`]).
    pub fn detect_from(mountinfo: &Path) -> Result<CgroupLayout, ReadError> {
        let t = std::fs::read_to_string(mountinfo).map_err(|source| ReadError {
            path: mountinfo.to_path_buf(),
            source,
        })?;
        Ok(Self::parse(&t))
    }

    /// Detect from `/proc/self/mountinfo`.
    pub fn detect() -> Result<CgroupLayout, ReadError> {
        Self::detect_from(Path::new(MOUNTINFO))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
24 30 0:22 / /sys rw,nosuid - sysfs sysfs rw
30 24 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 30 0:31 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
39 30 0:35 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const PURE: &str = "30 24 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";

    #[test]
    fn hybrid() {
        let l = CgroupLayout::parse(HYBRID);
        assert_eq!(l.kind, LayoutKind::Hybrid);
        assert_eq!(
            l.v1_devices.as_deref(),
            Some(Path::new("/sys/fs/cgroup/devices"))
        );
        assert_eq!(
            l.v2_root.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(l.v1_controllers, vec!["cpu", "devices"]);
    }

    #[test]
    fn pure_and_legacy() {
        let l = CgroupLayout::parse(PURE);
        assert_eq!(l.kind, LayoutKind::Unified);
        assert_eq!(l.v2_root.as_deref(), Some(Path::new("/sys/fs/cgroup")));
        assert!(l.v1_devices.is_none());
        let legacy: String = HYBRID
            .lines()
            .filter(|l| !l.contains("cgroup2"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(CgroupLayout::parse(&legacy).kind, LayoutKind::Legacy);
        assert_eq!(CgroupLayout::parse("").kind, LayoutKind::None);
        // name=systemd alone is not a controller
        let only_named = "39 30 0:35 / /x rw - cgroup cgroup rw,name=systemd\n40 30 0:36 / /y rw - cgroup2 cgroup2 rw\n";
        assert_eq!(CgroupLayout::parse(only_named).kind, LayoutKind::Unified);
    }

    #[test]
    fn escapes() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/a\\"), "/a\\");
    }

    #[test]
    fn this_machine() {
        // Whatever the machine, detection must not fail.
        let _ = CgroupLayout::detect().unwrap();
    }
}
