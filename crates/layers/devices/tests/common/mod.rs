//! Shared helpers of the root integration tests: fake NVIDIA device nodes (mknod, no driver:
//! an allowed open gives ENXIO, a denied one EPERM), driver files, cgroup trees cleaned up on
//! drop, and a forked "task" that joins a cgroup and opens devices.
#![allow(dead_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use tenancy_devices::{DriverPaths, SliceRef};

pub use tenancy_test_support::requires_root;

pub const NV: u32 = 195;
pub const CAPS: u32 = 508;
pub const UVM: u32 = 509;

pub const DEVICES: &str = "Character devices:\n  1 mem\n  5 /dev/tty\n136 pts\n195 nvidia-frontend\n508 nvidia-caps\n509 nvidia-uvm\n\nBlock devices:\n  7 loop\n";
pub const MIG: &str = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\ngpu1/gi1/access 147\ngpu1/gi1/ci0/access 148\n";

pub const SLICE_A: SliceRef = SliceRef {
    gpu_minor: 0,
    gi_id: 1,
    ci_id: 0,
};
pub const SLICE_B: SliceRef = SliceRef {
    gpu_minor: 0,
    gi_id: 2,
    ci_id: 0,
};

/// Temp dir with driver files and device nodes.
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("tenancy-devices-")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::write(dir.path().join("devices"), DEVICES).unwrap();
        std::fs::write(dir.path().join("mig-minors"), MIG).unwrap();
        std::fs::create_dir(dir.path().join("nvidia-caps")).unwrap();
        let f = Fixture { dir };
        for (name, ma, mi) in [
            ("nvidia0", NV, 0),
            ("nvidia1", NV, 1),
            ("nvidiactl", NV, 255),
            ("nvidia-modeset", NV, 254),
            ("nvidia-uvm", UVM, 0),
            ("nvidia-uvm-tools", UVM, 1),
            ("nvidia-caps/nvidia-cap1", CAPS, 1),
            ("nvidia-caps/nvidia-cap2", CAPS, 2),
            ("nvidia-caps/nvidia-cap12", CAPS, 12),
            ("nvidia-caps/nvidia-cap13", CAPS, 13),
            ("nvidia-caps/nvidia-cap21", CAPS, 21),
            ("nvidia-caps/nvidia-cap22", CAPS, 22),
            ("nvidia-caps/nvidia-cap147", CAPS, 147),
        ] {
            let p = CString::new(f.path(name).as_os_str().as_bytes()).unwrap();
            // SAFETY: valid path; creates a character device node.
            let r =
                unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(ma, mi)) };
            assert_eq!(r, 0, "mknod {name}: {}", std::io::Error::last_os_error());
            // Past the umask: a task of another uid than root opens them too.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(f.path(name), std::fs::Permissions::from_mode(0o666)).unwrap();
        }
        f
    }

    pub fn path(&self, name: &str) -> PathBuf {
        if name.starts_with('/') {
            return PathBuf::from(name);
        }
        self.dir.path().join(name)
    }

    pub fn driver(&self) -> DriverPaths {
        DriverPaths {
            proc_devices: self.dir.path().join("devices"),
            mig_minors: self.dir.path().join("mig-minors"),
            rdma_devices: self.dir.path().join("infiniband"),
            nvidia_caps: self.dir.path().join("nvidia-caps"),
        }
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A test-owned cgroup directory under `parent`, removed (depth first, our programs detached)
/// on drop.
pub struct CgTree {
    pub root: PathBuf,
}

impl CgTree {
    pub fn new(parent: &str, test: &str) -> CgTree {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let root = Path::new(parent).join(format!("tdev_{}_{}_{}", test, std::process::id(), n));
        std::fs::create_dir(&root).unwrap_or_else(|e| panic!("mkdir {}: {e}", root.display()));
        CgTree { root }
    }
    pub fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.root.join(rel);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

fn remove_tree(p: &Path) {
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = tenancy_devices::v2::detach_ours(p);
    let _ = std::fs::remove_dir(p);
}

impl Drop for CgTree {
    fn drop(&mut self) {
        remove_tree(&self.root);
    }
}

/// Fork a child that waits until the parent has written its pid into `<cgroup>/cgroup.procs`,
/// then opens every path O_RDWR and reports 0 or the errno. The child only makes raw
/// syscalls (no allocation) between fork and _exit.
pub fn open_as_task(cgroup: &Path, paths: &[PathBuf]) -> Vec<i32> {
    open_as_task_of(cgroup, paths, None)
}

/// [`open_as_task`] with the child's uid and gid set to `uid` (real, effective and saved)
/// before it opens anything.
pub fn open_as_task_of(cgroup: &Path, paths: &[PathBuf], uid: Option<u32>) -> Vec<i32> {
    let cpaths: Vec<CString> = paths
        .iter()
        .map(|p| CString::new(p.as_os_str().as_bytes()).unwrap())
        .collect();
    let ptrs: Vec<*const libc::c_char> = cpaths.iter().map(|c| c.as_ptr()).collect();
    let mut res = vec![0i32; paths.len()];
    let mut go = [0i32; 2];
    let mut back = [0i32; 2];
    // SAFETY: plain pipe/fork; the child touches only preallocated memory and raw syscalls.
    unsafe {
        assert_eq!(libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC), 0);
        assert_eq!(libc::pipe2(back.as_mut_ptr(), libc::O_CLOEXEC), 0);
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            let mut b = 0u8;
            if libc::read(go[0], &mut b as *mut u8 as *mut libc::c_void, 1) != 1 || b != b'g' {
                libc::_exit(3);
            }
            if let Some(u) = uid {
                if libc::setresgid(u, u, u) != 0 || libc::setresuid(u, u, u) != 0 {
                    libc::_exit(5);
                }
            }
            for (i, p) in ptrs.iter().enumerate() {
                let fd = libc::open(*p, libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOCTTY);
                res[i] = if fd >= 0 {
                    libc::close(fd);
                    0
                } else {
                    *libc::__errno_location()
                };
            }
            let n = res.len() * 4;
            let w = libc::write(back[1], res.as_ptr() as *const libc::c_void, n);
            libc::_exit(if w == n as isize { 0 } else { 4 });
        }
        libc::close(go[0]);
        libc::close(back[1]);
        let placed = std::fs::write(cgroup.join("cgroup.procs"), pid.to_string());
        if let Err(e) = placed {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            panic!("placing task {pid} into {}: {e}", cgroup.display());
        }
        assert_eq!(
            libc::write(go[1], b"g".as_ptr() as *const libc::c_void, 1),
            1
        );
        let n = res.len() * 4;
        let got = libc::read(back[0], res.as_mut_ptr() as *mut libc::c_void, n);
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        libc::close(go[1]);
        libc::close(back[0]);
        assert_eq!(got, n as isize, "child status {st}");
    }
    res
}

pub fn errname(e: i32) -> &'static str {
    match e {
        0 => "OK",
        libc::ENXIO => "ENXIO",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::ENOENT => "ENOENT",
        _ => "other",
    }
}

/// Expected outcome of an open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Allowed; no driver behind the node: ENXIO.
    Allowed,
    /// Denied by the cgroup: EPERM.
    Denied,
    /// A real device that must keep working (/dev/null): opens.
    Opens,
}

/// Run `open_as_task` and assert each outcome, with a readable table on failure.
pub fn check(fx: &Fixture, cgroup: &Path, cases: &[(&str, Want)]) {
    check_as(fx, cgroup, None, cases)
}

/// [`check`] in a task of uid `uid`.
pub fn check_as(fx: &Fixture, cgroup: &Path, uid: Option<u32>, cases: &[(&str, Want)]) {
    let paths: Vec<PathBuf> = cases.iter().map(|(n, _)| fx.path(n)).collect();
    if uid.is_some() {
        // What is checked is the device program, not the file mode: a prolog makes a job's
        // capability nodes 0444 as the driver does (caps.rs), which a task's O_RDWR open of
        // another uid than root would fail with EACCES before the program is asked.
        use std::os::unix::fs::PermissionsExt;
        for p in paths.iter().filter(|p| p.exists()) {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o666)).unwrap();
        }
    }
    let got = open_as_task_of(cgroup, &paths, uid);
    let mut bad = Vec::new();
    for ((name, want), g) in cases.iter().zip(&got) {
        let ok = match want {
            Want::Allowed => *g == libc::ENXIO,
            Want::Denied => *g == libc::EPERM,
            Want::Opens => *g == 0,
        };
        if !ok {
            bad.push(format!("{name}: want {want:?}, got {} ({g})", errname(*g)));
        }
    }
    assert!(
        bad.is_empty(),
        "in {}:\n{}",
        cgroup.display(),
        bad.join("\n")
    );
}

pub use Want::*;

/// The cases for a task of job A (slice gpu0/gi1/ci0).
pub fn job_a_cases() -> Vec<(&'static str, Want)> {
    vec![
        ("nvidia-caps/nvidia-cap12", Allowed), // A's GI
        ("nvidia-caps/nvidia-cap13", Allowed), // A's CI
        ("nvidia0", Allowed),                  // parent GPU
        ("nvidiactl", Allowed),
        ("nvidia-uvm", Allowed),
        ("nvidia-uvm-tools", Allowed),
        ("nvidia-caps/nvidia-cap21", Denied),  // job B's GI
        ("nvidia-caps/nvidia-cap22", Denied),  // job B's CI
        ("nvidia1", Denied),                   // another GPU
        ("nvidia-caps/nvidia-cap1", Denied),   // MIG config
        ("nvidia-caps/nvidia-cap2", Denied),   // MIG monitor
        ("nvidia-caps/nvidia-cap147", Denied), // another GPU's GI
        ("nvidia-modeset", Denied),
        ("/dev/null", Opens),
        ("/dev/zero", Opens),
    ]
}

pub fn job_b_cases() -> Vec<(&'static str, Want)> {
    vec![
        ("nvidia-caps/nvidia-cap21", Allowed),
        ("nvidia-caps/nvidia-cap22", Allowed),
        ("nvidia0", Allowed),
        ("nvidia-caps/nvidia-cap12", Denied),
        ("nvidia-caps/nvidia-cap13", Denied),
        ("nvidia-caps/nvidia-cap1", Denied),
        ("/dev/null", Opens),
    ]
}

/// Outside any restriction, every fake node gives ENXIO (proves the EPERMs come from us).
pub fn unrestricted_cases() -> Vec<(&'static str, Want)> {
    vec![
        ("nvidia-caps/nvidia-cap12", Allowed),
        ("nvidia-caps/nvidia-cap21", Allowed),
        ("nvidia-caps/nvidia-cap1", Allowed),
        ("nvidia1", Allowed),
        ("/dev/null", Opens),
    ]
}

/// A process in a folder of no job the node program knows (pure cgroup v2): every NVIDIA node
/// denied, the rest opens.
pub fn no_job_cases() -> Vec<(&'static str, Want)> {
    vec![
        ("nvidia-caps/nvidia-cap12", Denied),
        ("nvidia-caps/nvidia-cap21", Denied),
        ("nvidia-caps/nvidia-cap1", Denied),
        ("nvidia0", Denied),
        ("nvidia1", Denied),
        ("nvidiactl", Denied),
        ("nvidia-uvm", Denied),
        ("/dev/null", Opens),
        ("/dev/zero", Opens),
    ]
}
