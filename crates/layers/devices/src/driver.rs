//! Driver information: NVIDIA character-device majors from `/proc/devices` and MIG capability
//! minors from `/proc/driver/nvidia-caps/mig-minors`. Nothing here is hard-coded except the
//! minors the NVIDIA driver fixes by design (nvidiactl 255, /dev/nvidiaN = N, uvm 0, uvm-tools 1).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Default path of the kernel's device-major table.
pub const PROC_DEVICES: &str = "/proc/devices";
/// Default path of the NVIDIA MIG capability minor table.
pub const MIG_MINORS: &str = "/proc/driver/nvidia-caps/mig-minors";
/// Minor of `/dev/nvidiactl` on the `nvidia` major.
pub const NVIDIACTL_MINOR: u32 = 255;
/// Minor of `/dev/nvidia-modeset` on the `nvidia` major (never allowed by default).
pub const NVIDIA_MODESET_MINOR: u32 = 254;
/// Minor of `/dev/nvidia-uvm` on the `nvidia-uvm` major.
pub const UVM_MINOR: u32 = 0;
/// Minor of `/dev/nvidia-uvm-tools` on the `nvidia-uvm` major.
pub const UVM_TOOLS_MINOR: u32 = 1;

/// Paths of the two driver files (defaults: the real /proc files; tests pass the shim's copies).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverPaths {
    pub proc_devices: PathBuf,
    pub mig_minors: PathBuf,
    /// The folder of RDMA device nodes ([`RDMA_DEVICES`]).
    #[serde(default = "default_rdma_dir")]
    pub rdma_devices: PathBuf,
    /// Where the MIG capability nodes go (`/dev/nvidia-caps`): the prolog makes a job's there
    /// ([`crate::caps`]). Not journaled: it is the node's setting, nothing undoes the nodes, and
    /// the journal's intents stay as release 1 wrote them; whoever reads params back from a
    /// journal sets it from its config.
    #[serde(skip, default = "default_caps_dir")]
    pub nvidia_caps: PathBuf,
}

fn default_caps_dir() -> PathBuf {
    crate::caps::NVIDIA_CAPS.into()
}

/// Where the kernel's RDMA subsystem puts its device nodes: `uverbs<N>` (verbs: the data
/// path, whose traffic no firewall sees), `umad<N>`/`issm<N>` (management), `rdma_cm`, `ucm<N>`.
pub const RDMA_DEVICES: &str = "/dev/infiniband";

fn default_rdma_dir() -> PathBuf {
    RDMA_DEVICES.into()
}

impl Default for DriverPaths {
    fn default() -> Self {
        DriverPaths {
            proc_devices: PROC_DEVICES.into(),
            mig_minors: MIG_MINORS.into(),
            rdma_devices: RDMA_DEVICES.into(),
            nvidia_caps: default_caps_dir(),
        }
    }
}

/// One RDMA character device node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaDevice {
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
}

/// The character device nodes in `dir` (none when it does not exist: no RDMA on the node).
pub fn rdma_devices(dir: &Path) -> Result<Vec<RdmaDevice>> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|source| Error::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        let Ok(md) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if md.file_type().is_char_device() {
            let rdev = md.rdev();
            out.push(RdmaDevice {
                path: e.path(),
                major: libc::major(rdev),
                minor: libc::minor(rdev),
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// One MIG access capability: `gpu<N>/gi<G>/access` (ci = None) or `gpu<N>/gi<G>/ci<C>/access`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CapMinor {
    pub gpu: u32,
    pub gi: u32,
    pub ci: Option<u32>,
    pub minor: u32,
}

/// Parsed `mig-minors`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigMinors {
    /// Minor of the MIG `config` capability (jobs never get it).
    pub config: Option<u32>,
    /// Minor of the MIG `monitor` capability (jobs never get it).
    pub monitor: Option<u32>,
    /// Access capabilities, sorted by (gpu, gi, ci). With [`DriverInfo::load_for`] only the
    /// entries of the requested slices are kept.
    pub access: Vec<CapMinor>,
    /// Other well-formed `name minor` lines (newer drivers); always denied.
    pub other: Vec<(String, u32)>,
}

impl MigMinors {
    /// Minor of `gpu<gpu>/gi<gi>/access` (ci None) or `.../ci<ci>/access`.
    pub fn lookup(&self, gpu: u32, gi: u32, ci: Option<u32>) -> Option<u32> {
        // Compare on the key only (minor is the value).
        self.access
            .binary_search_by(|c| (c.gpu, c.gi, c.ci).cmp(&(gpu, gi, ci)))
            .ok()
            .map(|i| self.access[i].minor)
    }

    /// Parse the text of a mig-minors file. With `keep`, only access entries for which `keep`
    /// returns true are stored (every line is still validated: a malformed file fails closed).
    pub fn parse(
        text: &str,
        path: &Path,
        keep: Option<&dyn Fn(u32, u32, Option<u32>) -> bool>,
    ) -> Result<MigMinors> {
        Self::parse_lines(text, path, keep, None)
    }

    /// [`Self::parse`], looking only at the lines that start (after blanks) with one of
    /// `prefixes`, when given.
    fn parse_lines(
        text: &str,
        path: &Path,
        keep: Option<&dyn Fn(u32, u32, Option<u32>) -> bool>,
        prefixes: Option<&[String]>,
    ) -> Result<MigMinors> {
        let mut m = MigMinors::default();
        let lines: Box<dyn Iterator<Item = (usize, &str)>> = match prefixes {
            None => Box::new(text.lines().enumerate().map(|(i, l)| (i + 1, l))),
            Some(p) => Box::new(lines_starting_with(text, p).into_iter()),
        };
        for (number, raw) in lines {
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            let perr = |msg: &str| Error::Parse {
                path: path.to_path_buf(),
                line: number,
                msg: msg.to_string(),
                text: raw.to_string(),
            };
            let mut it = line.split_ascii_whitespace();
            let (name, minor) = match (it.next(), it.next(), it.next()) {
                (Some(n), Some(v), None) => (n, v),
                _ => return Err(perr("expected `<name> <minor>`")),
            };
            let minor: u32 = minor
                .parse()
                .map_err(|_| perr("minor is not a decimal number"))?;
            if minor >= 1 << 20 {
                return Err(perr("minor does not fit in 20 bits"));
            }
            match name {
                "config" => m.config = Some(minor),
                "monitor" => m.monitor = Some(minor),
                n if n.starts_with("gpu") => {
                    let (gpu, gi, ci) = parse_cap_name(n)
                        .ok_or_else(|| perr("malformed gpu<N>/gi<G>[/ci<C>]/access"))?;
                    if keep.is_none() || keep.is_some_and(|k| k(gpu, gi, ci)) {
                        m.access.push(CapMinor { gpu, gi, ci, minor });
                    }
                }
                n => m.other.push((n.to_string(), minor)),
            }
        }
        m.access.sort();
        for w in m.access.windows(2) {
            if (w[0].gpu, w[0].gi, w[0].ci) == (w[1].gpu, w[1].gi, w[1].ci) {
                return Err(Error::Parse {
                    path: path.to_path_buf(),
                    line: 0,
                    msg: "duplicate capability entry".into(),
                    text: format!("gpu{}/gi{}/{:?}", w[0].gpu, w[0].gi, w[0].ci),
                });
            }
        }
        Ok(m)
    }
}

/// The lines of `text` that start with one of `prefixes` after leading blanks, each with its
/// line number, in file order. The prefixes are found with a vectorised substring search, not
/// line by line: on a MIG job's path only a dozen of mig-minors' 4,000-odd lines matter, and
/// splitting and testing every line cost about 1.5 million instructions per prolog.
fn lines_starting_with<'t>(text: &'t str, prefixes: &[String]) -> Vec<(usize, &'t str)> {
    let bytes = text.as_bytes();
    let mut starts: Vec<usize> = Vec::new();
    for p in prefixes {
        for at in scan::find_all(bytes, p.as_bytes()) {
            let start = scan::rfind_newline(&bytes[..at]).map_or(0, |n| n + 1);
            // A match inside a line (not after its leading blanks) is not a line of that name.
            if text[start..at].trim_start().is_empty() {
                starts.push(start);
            }
        }
    }
    starts.sort_unstable();
    starts.dedup();
    let mut number = 1;
    let mut counted = 0;
    starts
        .into_iter()
        .map(|start| {
            number += scan::count_newlines(&bytes[counted..start]);
            counted = start;
            let end = scan::find_newline(&bytes[start..]).map_or(bytes.len(), |n| start + n);
            (number, text[start..end].trim_end_matches('\r'))
        })
        .collect()
}

/// The byte searches of [`lines_starting_with`], with x86_64's SSE2 routines named outright.
/// memchr's general entry points pick AVX2 at run time, and finding out whether the CPU has it
/// runs some ten CPUID instructions, each a trap to the hypervisor in a VM (6-7 µs here): more
/// than the whole scan, once per MIG job's prolog. Every x86_64 CPU has SSE2, so naming it
/// needs no check. Elsewhere memchr's own choice stands.
mod scan {
    #[cfg(target_arch = "x86_64")]
    use memchr::arch::x86_64::sse2::{memchr::One, packedpair::Finder};

    /// Where `needle` starts in `hay`, every place, in order.
    pub fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
        #[cfg(target_arch = "x86_64")]
        if let Some(f) = Finder::new(needle) {
            let mut found = Vec::new();
            let mut at = 0;
            while hay.len() - at >= f.min_haystack_len() {
                match f.find(&hay[at..], needle) {
                    Some(i) => {
                        found.push(at + i);
                        at += i + 1;
                    }
                    None => return found,
                }
            }
            // The tail, shorter than the vector search takes.
            found.extend(
                hay[at..]
                    .windows(needle.len())
                    .enumerate()
                    .filter(|(_, w)| *w == needle)
                    .map(|(i, _)| at + i),
            );
            return found;
        }
        memchr::memmem::find_iter(hay, needle).collect()
    }

    pub fn find_newline(hay: &[u8]) -> Option<usize> {
        #[cfg(target_arch = "x86_64")]
        if let Some(one) = One::new(b'\n') {
            return one.find(hay);
        }
        memchr::memchr(b'\n', hay)
    }

    pub fn rfind_newline(hay: &[u8]) -> Option<usize> {
        #[cfg(target_arch = "x86_64")]
        if let Some(one) = One::new(b'\n') {
            return one.rfind(hay);
        }
        memchr::memrchr(b'\n', hay)
    }

    pub fn count_newlines(hay: &[u8]) -> usize {
        #[cfg(target_arch = "x86_64")]
        if let Some(one) = One::new(b'\n') {
            return one.count(hay);
        }
        memchr::memchr_iter(b'\n', hay).count()
    }
}

/// A decimal of 1 to 9 digits at the start of `b`, and what follows it.
fn take_num(b: &[u8]) -> Option<(u32, &[u8])> {
    let len = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if len == 0 || len > 9 {
        return None;
    }
    let n = b[..len]
        .iter()
        .fold(0u32, |n, c| n * 10 + u32::from(c - b'0'));
    Some((n, &b[len..]))
}

/// `gpu<N>/gi<G>/access` or `gpu<N>/gi<G>/ci<C>/access`, scanned byte by byte: the prolog of a
/// MIG job validates all of the table's 4,000-odd lines.
fn parse_cap_name(n: &str) -> Option<(u32, u32, Option<u32>)> {
    let (gpu, rest) = take_num(n.as_bytes().strip_prefix(b"gpu")?)?;
    let (gi, rest) = take_num(rest.strip_prefix(b"/gi")?)?;
    if rest == b"/access" {
        return Some((gpu, gi, None));
    }
    let (ci, rest) = take_num(rest.strip_prefix(b"/ci")?)?;
    (rest == b"/access").then_some((gpu, gi, Some(ci)))
}

/// Character-device majors of the NVIDIA driver, from `/proc/devices`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaMajors {
    /// `nvidia-frontend` or `nvidia` (195 in practice): /dev/nvidiaN, nvidiactl, modeset.
    pub nvidia: Option<u32>,
    /// `nvidia-uvm`.
    pub uvm: Option<u32>,
    /// `nvidia-caps`.
    pub caps: Option<u32>,
    /// Every character major whose name starts with `nvidia` (the three above included, plus
    /// e.g. nvidia-nvlink, nvidia-nvswitch, nvidia-caps-imex-channels). All are denied except
    /// the devices a job is allowed.
    pub all: Vec<(String, u32)>,
}

impl NvidiaMajors {
    /// Parse `/proc/devices` text (only the "Character devices:" section counts).
    pub fn parse(text: &str, path: &Path) -> Result<NvidiaMajors> {
        let mut out = NvidiaMajors::default();
        let mut in_char = false;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            if line.ends_with(':') {
                in_char = line == "Character devices:";
                continue;
            }
            if !in_char {
                continue;
            }
            let perr = |msg: &str| Error::Parse {
                path: path.to_path_buf(),
                line: i + 1,
                msg: msg.to_string(),
                text: raw.to_string(),
            };
            let (num, name) = line
                .split_once(char::is_whitespace)
                .ok_or_else(|| perr("expected `<major> <name>`"))?;
            let major: u32 = num.parse().map_err(|_| perr("major is not a number"))?;
            if major >= 1 << 12 {
                return Err(perr("major does not fit in 12 bits"));
            }
            let name = name.trim();
            if !name.starts_with("nvidia") {
                continue;
            }
            match name {
                "nvidia-frontend" | "nvidia" => {
                    if out.nvidia.is_some_and(|m| m != major) {
                        return Err(perr("two different majors for the nvidia frontend"));
                    }
                    out.nvidia = Some(major)
                }
                "nvidia-uvm" => out.uvm = Some(major),
                "nvidia-caps" => out.caps = Some(major),
                _ => {}
            }
            if !out.all.iter().any(|(_, m)| *m == major) {
                out.all.push((name.to_string(), major));
            }
        }
        Ok(out)
    }
}

/// What the layer needs to know about the installed driver.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverInfo {
    pub majors: NvidiaMajors,
    pub mig: MigMinors,
    /// RDMA device nodes on the node: denied unless the tier lists them.
    #[serde(default)]
    pub rdma: Vec<RdmaDevice>,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl DriverInfo {
    /// Parse both files from text (for tests and callers that already hold the contents).
    pub fn parse(
        proc_devices: &str,
        mig_minors: Option<&str>,
        paths: &DriverPaths,
    ) -> Result<Self> {
        let majors = NvidiaMajors::parse(proc_devices, &paths.proc_devices)?;
        let mig = match mig_minors {
            Some(t) => MigMinors::parse(t, &paths.mig_minors, None)?,
            None => MigMinors::default(),
        };
        Ok(DriverInfo {
            majors,
            mig,
            rdma: Vec::new(),
        })
    }

    /// Load everything. A missing mig-minors file is an empty table when the `nvidia-caps`
    /// major is absent too (no driver, or a driver without MIG); otherwise an error.
    pub fn load(paths: &DriverPaths) -> Result<Self> {
        Self::load_inner(paths, None, None)
    }

    /// Hot path: load, keeping only the capability entries of `slices`. The file has thousands
    /// of lines; only `config`, `monitor` and the lines under the slices' `gpu<N>/gi<G>/` are
    /// parsed (and validated, duplicates included): the others cannot change a minor this job
    /// gets, and parsing them all was a third of a millisecond of every MIG prolog.
    pub fn load_for(paths: &DriverPaths, slices: &[crate::policy::SliceRef]) -> Result<Self> {
        if slices.is_empty() {
            // A job without a slice is denied every NVIDIA device by major: no minor is needed,
            // so the (4,000-line) mig-minors table is not read on its path.
            let majors = NvidiaMajors::parse(&read(&paths.proc_devices)?, &paths.proc_devices)?;
            return Ok(DriverInfo {
                majors,
                mig: MigMinors::default(),
                rdma: rdma_devices(&paths.rdma_devices)?,
            });
        }
        let keep = |gpu: u32, gi: u32, ci: Option<u32>| {
            slices.iter().any(|s| {
                s.gpu_minor == gpu && s.gi_id == gi && (ci.is_none() || ci == Some(s.ci_id))
            })
        };
        let mut prefixes: Vec<String> = ["config", "monitor"].map(String::from).into();
        prefixes.extend(
            slices
                .iter()
                .map(|s| format!("gpu{}/gi{}/", s.gpu_minor, s.gi_id)),
        );
        prefixes.sort();
        prefixes.dedup();
        Self::load_inner(paths, Some(&keep), Some(&prefixes))
    }

    fn load_inner(
        paths: &DriverPaths,
        keep: Option<&dyn Fn(u32, u32, Option<u32>) -> bool>,
        prefixes: Option<&[String]>,
    ) -> Result<Self> {
        let majors = NvidiaMajors::parse(&read(&paths.proc_devices)?, &paths.proc_devices)?;
        let mig = match std::fs::read_to_string(&paths.mig_minors) {
            Ok(t) => MigMinors::parse_lines(&t, &paths.mig_minors, keep, prefixes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && majors.caps.is_none() => {
                MigMinors::default()
            }
            Err(source) => {
                return Err(Error::Read {
                    path: paths.mig_minors.clone(),
                    source,
                })
            }
        };
        let rdma = rdma_devices(&paths.rdma_devices)?;
        Ok(DriverInfo { majors, mig, rdma })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const DEVICES: &str = "Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n136 pts\n195 nvidia-frontend\n234 nvidia-nvswitch\n235 nvidia-caps\n237 nvidia-uvm\n\nBlock devices:\n  7 loop\n195 nvidia-fake-block\n";

    #[test]
    fn a_job_reads_only_its_own_lines_of_the_table_and_still_validates_them() {
        let dir = tempfile::tempdir().unwrap();
        let paths = DriverPaths {
            proc_devices: dir.path().join("devices"),
            mig_minors: dir.path().join("mig-minors"),
            rdma_devices: dir.path().join("infiniband"),
            nvidia_caps: dir.path().join("nvidia-caps"),
        };
        std::fs::write(&paths.proc_devices, DEVICES).unwrap();
        let slice = [crate::policy::SliceRef {
            gpu_minor: 1,
            gi_id: 2,
            ci_id: 0,
        }];
        let table = |extra: &str| {
            format!(
                "config 1\nmonitor 2\ngpu0/gi2/access 21\nnonsense here too\n\
                 gpu1/gi2/access 147\ngpu1/gi2/ci0/access 148\ngpu1/gi20/access 300\n{extra}"
            )
        };
        // A damaged line elsewhere does not concern this job.
        std::fs::write(&paths.mig_minors, table("gpu9/gi9/access x\n")).unwrap();
        let info = DriverInfo::load_for(&paths, &slice).unwrap();
        assert_eq!(info.mig.lookup(1, 2, None), Some(147));
        assert_eq!(info.mig.lookup(1, 2, Some(0)), Some(148));
        assert_eq!((info.mig.config, info.mig.monitor), (Some(1), Some(2)));
        assert_eq!(info.mig.access.len(), 2, "only the job's entries are kept");
        // Its own lines are validated, with the file's line numbers, duplicates included.
        std::fs::write(&paths.mig_minors, table("gpu1/gi2/ci0/access 9x\n")).unwrap();
        let e = DriverInfo::load_for(&paths, &slice)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 8:"), "{e}");
        std::fs::write(&paths.mig_minors, table("gpu1/gi2/access 999\n")).unwrap();
        assert!(DriverInfo::load_for(&paths, &slice).is_err());
        // The whole table is still validated where everything is read (doctor).
        std::fs::write(&paths.mig_minors, table("")).unwrap();
        assert!(DriverInfo::load(&paths).is_err());
    }

    #[test]
    fn the_prefix_scan_finds_the_lines_a_line_by_line_filter_finds() {
        let text = "config 1\r\nmonitor 2\n  gpu1/gi2/access 5\nxgpu1/gi2/access 6\n\
                    gpu11/gi2/access 7\ngpu1/gi2/ci0/access 8\n\tgpu1/gi2/ci1/access 9\n\
                    a config 3\ngpu1/gi2/";
        let prefixes: Vec<String> = ["config", "gpu1/gi2/", "monitor"].map(String::from).into();
        fn line_by_line<'t>(text: &'t str, prefixes: &[String]) -> Vec<(usize, &'t str)> {
            text.lines()
                .enumerate()
                .filter(|(_, l)| prefixes.iter().any(|p| l.trim().starts_with(p.as_str())))
                .map(|(i, l)| (i + 1, l))
                .collect()
        }
        let naive = line_by_line(text, &prefixes);
        assert_eq!(lines_starting_with(text, &prefixes), naive);
        assert_eq!(
            naive.iter().map(|l| l.0).collect::<Vec<_>>(),
            [1, 2, 3, 6, 7, 9]
        );
        // A table long enough for the vector search, with matches at its very start and end
        // and in the tail it leaves to the plain one.
        let mut long = String::from("gpu1/gi2/access 1\n");
        for i in 0..300 {
            long.push_str(&format!("gpu{}/gi{}/access {}\n", i % 3, i % 7, 100 + i));
        }
        long.push_str("gpu1/gi2/ci0/access 2\ngpu1/gi2/");
        let naive = line_by_line(&long, &prefixes);
        // The first line, i = 16 mod 21 (14 of them), the CI's line and the cut-off last one.
        assert_eq!(naive.len(), 1 + 14 + 1 + 1);
        assert_eq!(lines_starting_with(&long, &prefixes), naive);
        for n in 0..40 {
            let cut = &long[..long.len() - n];
            let hay = cut.as_bytes();
            let plain: Vec<usize> = hay
                .windows(9)
                .enumerate()
                .filter(|(_, w)| *w == b"gpu1/gi2/")
                .map(|(i, _)| i)
                .collect();
            assert_eq!(scan::find_all(hay, b"gpu1/gi2/"), plain, "cut {n}");
        }
    }

    #[test]
    fn cap_names() {
        assert_eq!(parse_cap_name("gpu0/gi3/access"), Some((0, 3, None)));
        assert_eq!(
            parse_cap_name("gpu12/gi0/ci7/access"),
            Some((12, 0, Some(7)))
        );
        assert_eq!(parse_cap_name("gpu007/gi1/access"), Some((7, 1, None)));
        for bad in [
            "gpu/gi0/access",
            "gpu0/gi0",
            "gpu0/gi0/access/x",
            "gpu0/gi0/ci/access",
            "gpu0/gi0/cix/access",
            "gpu1234567890/gi0/access",
            "gpu0/gi0/ci0/access ",
            "gpu-1/gi0/access",
            "cpu0/gi0/access",
        ] {
            assert_eq!(parse_cap_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn majors() {
        let m = NvidiaMajors::parse(DEVICES, Path::new("d")).unwrap();
        assert_eq!(m.nvidia, Some(195));
        assert_eq!(m.caps, Some(235));
        assert_eq!(m.uvm, Some(237));
        let all: Vec<u32> = m.all.iter().map(|x| x.1).collect();
        assert_eq!(all, vec![195, 234, 235, 237]);
        // newer drivers name the frontend "nvidia"
        let m = NvidiaMajors::parse("Character devices:\n195 nvidia\n", Path::new("d")).unwrap();
        assert_eq!(m.nvidia, Some(195));
        assert!(NvidiaMajors::parse("Character devices:\nxx nvidia\n", Path::new("d")).is_err());
        let m = NvidiaMajors::parse("Character devices:\n1 mem\n", Path::new("d")).unwrap();
        assert_eq!(m, NvidiaMajors::default());
    }

    #[test]
    fn mig_minors() {
        let t = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu1/gi2/access 140\nfabric-imex-mgmt 9\n";
        let m = MigMinors::parse(t, Path::new("m"), None).unwrap();
        assert_eq!(m.config, Some(1));
        assert_eq!(m.monitor, Some(2));
        assert_eq!(m.lookup(0, 1, None), Some(12));
        assert_eq!(m.lookup(0, 1, Some(0)), Some(13));
        assert_eq!(m.lookup(1, 2, None), Some(140));
        assert_eq!(m.lookup(1, 2, Some(0)), None);
        assert_eq!(m.other, vec![("fabric-imex-mgmt".to_string(), 9)]);
        for bad in [
            "gpu0/gi1/access",
            "gpu0/gi1/access x",
            "gpux/gi1/access 3",
            "gpu0/gi1/ci/access 3",
            "gpu0/gi1/ci0/foo 3",
            "gpu0/gi1/access 3\ngpu0/gi1/access 4",
            "config 1 2",
        ] {
            assert!(
                MigMinors::parse(bad, Path::new("m"), None).is_err(),
                "{bad}"
            );
        }
        let keep = |g: u32, gi: u32, _ci: Option<u32>| g == 1 && gi == 2;
        let m = MigMinors::parse(t, Path::new("m"), Some(&keep)).unwrap();
        assert_eq!(m.access.len(), 1);
        assert_eq!(m.config, Some(1));
    }
}
