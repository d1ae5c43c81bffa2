//! The capability device nodes of a job's MIG slice, made by the prolog.
//!
//! A CUDA process in a MIG instance opens `/dev/nvidia-caps/nvidia-cap<GI>` and
//! `nvidia-cap<CI>` (MIG user guide, "Device Nodes and Capabilities"). The driver makes no node
//! in /dev: `nvidia-modprobe -f /proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>/...` makes it
//! the first time a process asks for it, which inside the job's device allowlist fails (the
//! allowlist grants read and write, not mknod). So the prolog makes the job's two nodes itself,
//! as root and as nvidia-modprobe would: the folder 0755, each node a character device on the
//! `nvidia-caps` major (from /proc/devices) with the capability's minor (from mig-minors), mode
//! 0444, owned by root; a node there of another type or number is replaced. The nodes stay after
//! the job (as nvidia-modprobe's do): the allowlist, not the node, keeps other jobs out.

use crate::driver::DriverInfo;
use crate::error::{Error, Result};
use crate::policy::SliceRef;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Where NVIDIA's tools put the capability nodes.
pub const NVIDIA_CAPS: &str = "/dev/nvidia-caps";
/// The mode the driver gives MIG access capabilities (DeviceFileMode 0444).
pub const ACCESS_MODE: u32 = 0o444;
/// The folder's mode, as nvidia-modprobe makes it.
pub const DIR_MODE: u32 = 0o755;

fn io(e: rustix::io::Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.raw_os_error())
}

/// Opens `dir` (made, 0755, when missing) without following a symlink at its last component.
fn open_dir(dir: &Path) -> std::result::Result<OwnedFd, rustix::io::Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::open(dir, flags, Mode::empty()) {
        Err(rustix::io::Errno::NOENT) => {
            match rustix::fs::mkdir(dir, Mode::from_raw_mode(DIR_MODE)) {
                Ok(()) => {
                    // (the umask may have narrowed it)
                    rustix::fs::chmod(dir, Mode::from_raw_mode(DIR_MODE))?;
                }
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e),
            }
            rustix::fs::open(dir, flags, Mode::empty())
        }
        other => other,
    }
}

/// Makes `name` in `dir` the character device `major:minor`, mode [`ACCESS_MODE`], root's;
/// returns whether it had to be made or fixed.
fn ensure(dir: &OwnedFd, name: &str, major: u32, minor: u32) -> rustix::io::Result<bool> {
    let want = rustix::fs::makedev(major, minor);
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW);
    let make = match &st {
        Ok(st)
            if FileType::from_raw_mode(st.st_mode) == FileType::CharacterDevice
                && st.st_rdev == want =>
        {
            if st.st_mode & 0o7777 == ACCESS_MODE && st.st_uid == 0 && st.st_gid == 0 {
                return Ok(false);
            }
            false
        }
        Ok(_) => {
            rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
            true
        }
        Err(rustix::io::Errno::NOENT) => true,
        Err(e) => return Err(*e),
    };
    if make {
        match rustix::fs::mknodat(
            dir,
            name,
            FileType::CharacterDevice,
            Mode::from_raw_mode(ACCESS_MODE),
            want,
        ) {
            Ok(()) => {}
            // Made meanwhile (another prolog, nvidia-modprobe): checked below.
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e),
        }
        let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::CharacterDevice || st.st_rdev != want {
            return Err(rustix::io::Errno::EXIST);
        }
    }
    rustix::fs::chmodat(
        dir,
        name,
        Mode::from_raw_mode(ACCESS_MODE),
        AtFlags::empty(),
    )?;
    rustix::fs::chownat(
        dir,
        name,
        Some(rustix::fs::Uid::ROOT),
        Some(rustix::fs::Gid::ROOT),
        AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(true)
}

/// The paths of the GI and CI capability nodes of `slices` in `dir`, with their (major, minor).
pub fn job_nodes(
    dir: &Path,
    drv: &DriverInfo,
    slices: &[SliceRef],
) -> Result<Vec<(PathBuf, u32, u32)>> {
    let mut out = Vec::new();
    if slices.is_empty() {
        return Ok(out);
    }
    let major = drv.majors.caps.ok_or_else(|| {
        Error::Policy(
            "the driver has no nvidia-caps major in /proc/devices: the slice's capability \
             nodes cannot be made (load a MIG-capable NVIDIA driver)"
                .into(),
        )
    })?;
    for s in slices {
        for ci in [None, Some(s.ci_id)] {
            let minor = drv.mig.lookup(s.gpu_minor, s.gi_id, ci).ok_or_else(|| {
                Error::Policy(format!(
                    "mig-minors has no entry for gpu{}/gi{}{}/access: the driver and the slice \
                     disagree",
                    s.gpu_minor,
                    s.gi_id,
                    ci.map(|c| format!("/ci{c}")).unwrap_or_default()
                ))
            })?;
            let path = dir.join(format!("nvidia-cap{minor}"));
            if !out.iter().any(|(p, _, _)| *p == path) {
                out.push((path, major, minor));
            }
        }
    }
    Ok(out)
}

/// Makes the capability nodes of `slices` in `dir` (see the module's comment); returns the
/// paths of those it made or fixed.
pub fn make_job_nodes(dir: &Path, drv: &DriverInfo, slices: &[SliceRef]) -> Result<Vec<PathBuf>> {
    let nodes = job_nodes(dir, drv, slices)?;
    if nodes.is_empty() {
        return Ok(Vec::new());
    }
    let fd = open_dir(dir).map_err(|e| Error::CapNode {
        path: dir.to_path_buf(),
        major: nodes[0].1,
        minor: nodes[0].2,
        source: io(e),
    })?;
    let mut made = Vec::new();
    for (path, major, minor) in nodes {
        let name = path.file_name().expect("a file name").to_owned();
        match ensure(&fd, name.to_str().expect("ASCII"), major, minor) {
            Ok(true) => made.push(path),
            Ok(false) => {}
            Err(e) => {
                return Err(Error::CapNode {
                    path,
                    major,
                    minor,
                    source: io(e),
                })
            }
        }
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    fn driver() -> DriverInfo {
        DriverInfo::parse(
            "Character devices:\n195 nvidia-frontend\n235 nvidia-caps\n",
            Some("config 1\nmonitor 2\ngpu1/gi2/access 147\ngpu1/gi2/ci0/access 148\n"),
            &crate::DriverPaths::default(),
        )
        .unwrap()
    }

    const SLICE: SliceRef = SliceRef {
        gpu_minor: 1,
        gi_id: 2,
        ci_id: 0,
    };

    #[test]
    fn the_nodes_of_a_slice() {
        let nodes = job_nodes(Path::new("/dev/nvidia-caps"), &driver(), &[SLICE]).unwrap();
        assert_eq!(
            nodes,
            vec![
                ("/dev/nvidia-caps/nvidia-cap147".into(), 235, 147),
                ("/dev/nvidia-caps/nvidia-cap148".into(), 235, 148),
            ]
        );
        assert!(job_nodes(Path::new("/x"), &driver(), &[])
            .unwrap()
            .is_empty());
        let other = SliceRef { gi_id: 3, ..SLICE };
        let e = job_nodes(Path::new("/x"), &driver(), &[other]).unwrap_err();
        assert!(e.to_string().contains("gpu1/gi3/access"), "{e}");
    }

    #[test]
    fn made_as_nvidia_modprobe_makes_them() {
        if std::fs::metadata("/proc/self").map_or(true, |m| m.uid() != 0) {
            assert!(std::env::var_os("CI").is_none(), "mknod needs root");
            eprintln!("SKIP (needs root: mknod)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("nvidia-caps");
        let made = make_job_nodes(&dir, &driver(), &[SLICE]).unwrap();
        assert_eq!(made.len(), 2);
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777,
            DIR_MODE
        );
        for (name, minor) in [("nvidia-cap147", 147), ("nvidia-cap148", 148)] {
            let m = std::fs::symlink_metadata(dir.join(name)).unwrap();
            assert!(m.file_type().is_char_device(), "{name}");
            assert_eq!(m.rdev(), rustix::fs::makedev(235, minor), "{name}");
            assert_eq!(m.mode() & 0o7777, ACCESS_MODE, "{name}");
            assert_eq!((m.uid(), m.gid()), (0, 0), "{name}");
        }
        // Again: nothing to do.
        assert!(make_job_nodes(&dir, &driver(), &[SLICE])
            .unwrap()
            .is_empty());
        // A wrong node, a plain file, a loosened mode: each put right.
        std::fs::remove_file(dir.join("nvidia-cap147")).unwrap();
        std::fs::write(dir.join("nvidia-cap147"), "x").unwrap();
        std::fs::set_permissions(dir.join("nvidia-cap148"), PermissionsExt::from_mode(0o666))
            .unwrap();
        assert_eq!(make_job_nodes(&dir, &driver(), &[SLICE]).unwrap().len(), 2);
        let m = std::fs::symlink_metadata(dir.join("nvidia-cap147")).unwrap();
        assert!(m.file_type().is_char_device());
        let m = std::fs::symlink_metadata(dir.join("nvidia-cap148")).unwrap();
        assert_eq!(m.mode() & 0o7777, ACCESS_MODE);
        // A symlinked folder is not followed.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(make_job_nodes(&link, &driver(), &[SLICE]).is_err());
    }
}
