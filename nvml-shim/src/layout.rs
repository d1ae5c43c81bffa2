//! Driver-side files the device layer reads: device nodes made with mknod in `dev_dir`,
//! the mig-minors table and a /proc/devices-style file.
//!
//! dev_dir/nvidia<N>          c 195:N          (one per GPU, N = index)
//! dev_dir/nvidiactl          c 195:255
//! dev_dir/nvidia-uvm         c <uvm>:0
//! dev_dir/nvidia-uvm-tools   c <uvm>:1
//! dev_dir/nvidia-caps/nvidia-cap1, nvidia-cap2        c <caps>:1 / :2 (config, monitor; 0400)
//! dev_dir/nvidia-caps/nvidia-cap<minor>               with fixture `instance_caps` only:
//!                                                      c <caps>:<minor> for every existing GI
//!                                                      and CI (0444), removed when it goes.
//!
//! The real driver makes no node in /dev: nvidia-modprobe makes a capability's node when a
//! process first asks for it (or the prolog does, for the job's slice). Without
//! `instance_caps` the stand-in does the same: it makes only config and monitor, and leaves
//! every other node in nvidia-caps to whoever made it.

use crate::config::{Config, NVIDIACTL_MINOR, NVIDIA_MAJOR};
use crate::model;
use crate::state::State;
use crate::store::StoreError;
use rustix::fs::{FileType, Mode, OFlags};
use std::collections::BTreeSet;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

fn e(what: String) -> StoreError {
    StoreError(format!("nvml-shim layout: {what}"))
}

/// Opens (creating) a folder without following a symlink at its last component.
fn open_dir_at(parent: Option<&OwnedFd>, path: &Path) -> Result<OwnedFd, StoreError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let open = |p: &Path| match parent {
        Some(d) => rustix::fs::openat(d.as_fd(), p, flags, Mode::empty()),
        None => rustix::fs::open(p, flags, Mode::empty()),
    };
    match open(path) {
        Ok(fd) => Ok(fd),
        Err(rustix::io::Errno::NOENT) => {
            let r = match parent {
                Some(d) => rustix::fs::mkdirat(d.as_fd(), path, Mode::from_raw_mode(0o755)),
                None => {
                    if let Some(pp) = path.parent() {
                        std::fs::create_dir_all(pp)
                            .map_err(|x| e(format!("cannot create {}: {x}", pp.display())))?;
                    }
                    rustix::fs::mkdir(path, Mode::from_raw_mode(0o755))
                }
            };
            match r {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(x) => return Err(e(format!("cannot mkdir {}: {x}", path.display()))),
            }
            open(path).map_err(|x| e(format!("cannot open folder {}: {x}", path.display())))
        }
        Err(x) => Err(e(format!(
            "cannot open folder {} (a symlink or not a folder?): {x}",
            path.display()
        ))),
    }
}

/// Makes `name` in `dir` a char device major:minor with `mode`, replacing anything else there.
fn ensure_node(
    dir: &OwnedFd,
    dir_path: &Path,
    name: &str,
    major: u32,
    minor: u32,
    mode: u32,
) -> Result<(), StoreError> {
    let want = rustix::fs::makedev(major, minor);
    match rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st)
            if FileType::from_raw_mode(st.st_mode) == FileType::CharacterDevice
                && st.st_rdev == want
                && st.st_mode & 0o7777 == mode =>
        {
            return Ok(())
        }
        Ok(_) => {
            rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::empty())
                .map_err(|x| e(format!("cannot replace {}/{name}: {x}", dir_path.display())))?;
        }
        Err(_) => {}
    }
    rustix::fs::mknodat(
        dir,
        name,
        FileType::CharacterDevice,
        Mode::from_raw_mode(mode),
        want,
    )
    .map_err(|x| {
        e(format!(
            "mknod {}/{name} c {major}:{minor} failed: {x} (needs root / CAP_MKNOD)",
            dir_path.display()
        ))
    })?;
    rustix::fs::chmodat(
        dir,
        name,
        Mode::from_raw_mode(mode),
        rustix::fs::AtFlags::empty(),
    )
    .map_err(|x| e(format!("chmod {}/{name}: {x}", dir_path.display())))
}

fn write_atomic(path: &Path, text: &str) -> Result<(), StoreError> {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.file_type().is_symlink() {
            return Err(e(format!(
                "refusing to write through symlink {}",
                path.display()
            )));
        }
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(|x| e(format!("cannot create {}: {x}", dir.display())))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let fd = rustix::fs::open(
        &tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o444),
    )
    .map_err(|x| e(format!("cannot create {}: {x}", tmp.display())))?;
    let mut f = std::fs::File::from(fd);
    f.write_all(text.as_bytes())
        .map_err(|x| e(format!("cannot write {}: {x}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(|x| e(format!("cannot rename to {}: {x}", path.display())))
}

/// /proc/devices text naming the majors the shim uses.
pub fn proc_devices_text(cfg: &Config) -> String {
    let mut lines = [
        (NVIDIA_MAJOR, "nvidia-frontend"),
        (cfg.caps_major, "nvidia-caps"),
        (cfg.uvm_major, "nvidia-uvm"),
    ];
    lines.sort();
    let mut s = String::from("Character devices:\n");
    for (m, n) in lines {
        s.push_str(&format!("{m:3} {n}\n"));
    }
    s.push_str("\nBlock devices:\n");
    s
}

/// Majors already taken on this machine (from the real /proc/devices), for a warning.
pub fn host_major_conflicts(cfg: &Config) -> Vec<String> {
    let Ok(t) = std::fs::read_to_string("/proc/devices") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut chr = false;
    for l in t.lines() {
        if l.starts_with("Character devices") {
            chr = true;
            continue;
        }
        if l.starts_with("Block devices") {
            chr = false;
        }
        if !chr {
            continue;
        }
        let mut it = l.split_whitespace();
        if let (Some(m), Some(n)) = (it.next(), it.next()) {
            if let Ok(m) = m.parse::<u32>() {
                if (m == cfg.uvm_major || m == cfg.caps_major) && !n.starts_with("nvidia") {
                    out.push(format!("major {m} is used by {n} on this machine"));
                }
            }
        }
    }
    out
}

/// Minors of every nvidia-cap node the stand-in makes for `st`: config and monitor, and with
/// `instance_caps` every existing GI's and CI's.
pub fn wanted_cap_minors(cfg: &Config, st: &State) -> BTreeSet<u32> {
    let mut s: BTreeSet<u32> = [model::CONFIG_MINOR, model::MONITOR_MINOR].into();
    if !cfg.instance_caps {
        return s;
    }
    for (i, g) in st.gpus.iter().enumerate() {
        for gi in &g.gis {
            s.insert(model::gi_access_minor(i as u32, gi.id));
            for ci in &gi.cis {
                s.insert(model::ci_access_minor(i as u32, gi.id, ci.id));
            }
        }
    }
    s
}

/// Creates and removes nvidia-caps/nvidia-cap<minor> nodes to match `st`. The layout stays
/// recorded as current when it was before (the changes are this function's own).
pub fn sync_caps(cfg: &Config, st: &mut State) -> Result<(), StoreError> {
    let Some(dev) = &cfg.dev_dir else {
        return Ok(());
    };
    if !cfg.instance_caps {
        // As the driver: instances come and go without a node made or removed.
        return Ok(());
    }
    let was_current = is_current(cfg, st);
    st.layout_stamp = None;
    sync_caps_only(cfg, dev, st)?;
    if was_current {
        st.layout_stamp = stamps(cfg);
    }
    Ok(())
}

fn sync_caps_only(cfg: &Config, dev: &Path, st: &State) -> Result<(), StoreError> {
    let dfd = open_dir_at(None, dev)?;
    let caps_path = dev.join("nvidia-caps");
    let cfd = open_dir_at(Some(&dfd), Path::new("nvidia-caps"))?;
    let want = wanted_cap_minors(cfg, st);
    for m in &want {
        let mode = if *m <= model::MONITOR_MINOR {
            0o400
        } else {
            0o444
        };
        ensure_node(
            &cfd,
            &caps_path,
            &format!("nvidia-cap{m}"),
            cfg.caps_major,
            *m,
            mode,
        )?;
    }
    if !cfg.instance_caps {
        // The other nodes there are nvidia-modprobe's or the prolog's, not the stand-in's.
        return Ok(());
    }
    let rd = std::fs::read_dir(&caps_path)
        .map_err(|x| e(format!("cannot list {}: {x}", caps_path.display())))?;
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        let Some(num) = name.strip_prefix("nvidia-cap") else {
            continue;
        };
        let Ok(m) = num.parse::<u32>() else { continue };
        if !want.contains(&m) {
            match rustix::fs::unlinkat(&cfd, name.as_str(), rustix::fs::AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(x) => {
                    return Err(e(format!(
                        "cannot remove {}/{name}: {x}",
                        caps_path.display()
                    )))
                }
            }
        }
    }
    Ok(())
}

/// Identity and age of a file (see `State::mig_minors_stamp`); None when it cannot be read.
fn stamp(p: &Path) -> Option<[i64; 5]> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).ok()?;
    Some([
        m.dev() as i64,
        m.ino() as i64,
        m.size() as i64,
        m.mtime(),
        m.mtime_nsec(),
    ])
}

/// The stamps of the files a layout makes (see `State::layout_stamp`); None when one is
/// missing or the configuration names none.
pub fn stamps(cfg: &Config) -> Option<Vec<[i64; 5]>> {
    let mut paths: Vec<std::path::PathBuf> = Vec::new();
    if let Some(dev) = &cfg.dev_dir {
        paths.push(dev.clone());
        if cfg.instance_caps {
            paths.push(dev.join("nvidia-caps"));
        } else {
            // Nodes others make in the folder (the prolog's) are not the layout's business.
            for m in [model::CONFIG_MINOR, model::MONITOR_MINOR] {
                paths.push(dev.join("nvidia-caps").join(format!("nvidia-cap{m}")));
            }
        }
    }
    paths.extend(cfg.mig_minors.iter().cloned());
    paths.extend(cfg.proc_devices.iter().cloned());
    if paths.is_empty() {
        return None;
    }
    paths.iter().map(|p| stamp(p)).collect()
}

/// Whether the driver's files are as the last layout left them (an nvmlInit then skips it):
/// a node made, removed or replaced changes its folder's stamp, a rewritten file its own.
pub fn is_current(cfg: &Config, st: &State) -> bool {
    st.layout_stamp.is_some() && st.layout_stamp == stamps(cfg)
}

/// Full layout: static nodes, mig-minors, proc-devices, then the caps for `st`.
pub fn layout(cfg: &Config, st: &mut State) -> Result<(), StoreError> {
    st.layout_stamp = None;
    if let Some(dev) = &cfg.dev_dir {
        let dfd = open_dir_at(None, dev)?;
        for i in 0..cfg.gpus.len() as u32 {
            ensure_node(&dfd, dev, &format!("nvidia{i}"), NVIDIA_MAJOR, i, 0o666)?;
        }
        ensure_node(&dfd, dev, "nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR, 0o666)?;
        ensure_node(&dfd, dev, "nvidia-uvm", cfg.uvm_major, 0, 0o666)?;
        ensure_node(&dfd, dev, "nvidia-uvm-tools", cfg.uvm_major, 1, 0o666)?;
        sync_caps_only(cfg, dev, st)?;
    }
    if let Some(p) = &cfg.mig_minors {
        // Rebuilt and compared only when the file is not the one the last layout checked.
        let now = stamp(p);
        if now.is_none() || now != st.mig_minors_stamp {
            let text = model::mig_minors_text();
            if std::fs::read_to_string(p).ok().as_deref() != Some(text.as_str()) {
                write_atomic(p, &text)?;
            }
            st.mig_minors_stamp = stamp(p);
        }
    }
    if let Some(p) = &cfg.proc_devices {
        let text = proc_devices_text(cfg);
        if std::fs::read_to_string(p).ok().as_deref() != Some(text.as_str()) {
            write_atomic(p, &text)?;
        }
    }
    st.layout_stamp = stamps(cfg);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn mig_minors_is_rebuilt_only_when_the_file_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = Config::from_fixture_text(
            "state = \"state.json\"\nmig_minors = \"mig-minors\"\n[[gpus]]\nmodel = \"H200-141GB\"\n",
            tmp.path(),
        )
        .unwrap();
        let path = tmp.path().join("mig-minors");
        let mut st = State::fresh(&cfg.gpus, Default::default());
        layout(&cfg, &mut st).unwrap();
        let want = model::mig_minors_text();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
        assert!(st.mig_minors_stamp.is_some());
        // Unchanged: the next layout leaves the file (same inode) and the stamp alone.
        let ino = std::fs::metadata(&path).unwrap().ino();
        let before = st.mig_minors_stamp;
        layout(&cfg, &mut st).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), ino);
        assert_eq!(st.mig_minors_stamp, before);
        // Damaged in place (another size): restored, and the stamp follows the new file.
        std::fs::write(&path, "config 1\n").unwrap();
        layout(&cfg, &mut st).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
        assert_eq!(st.mig_minors_stamp, stamp(&path));
        // Removed: written again.
        std::fs::remove_file(&path).unwrap();
        layout(&cfg, &mut st).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
    }

    /// The layout stays current through the caps' own changes (so the next nvmlInit skips
    /// it) and stops being current when something else changes a file.
    #[test]
    fn the_layout_is_current_until_someone_else_changes_a_file() {
        if !tenancy_test_support::requires_root("mknod") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let cfg = Config::from_fixture_text(
            "state = \"state.json\"\ndev_dir = \"dev\"\nmig_minors = \"mig-minors\"\n\
             proc_devices = \"devices\"\ninstance_caps = true\n\
             [[gpus]]\nmodel = \"H200-141GB\"\nmig_mode = true\n",
            tmp.path(),
        )
        .unwrap();
        let mut st = State::fresh(&cfg.gpus, Default::default());
        assert!(!is_current(&cfg, &st));
        layout(&cfg, &mut st).unwrap();
        assert!(is_current(&cfg, &st));
        // A GI's cap node, made by sync_caps: still current.
        st.create_gi(0, 19, None, crate::state::FaultSources { local: None })
            .unwrap();
        sync_caps(&cfg, &mut st).unwrap();
        assert_eq!(wanted_cap_minors(&cfg, &st).len(), 3);
        assert!(is_current(&cfg, &st));
        // Removed by someone else: not current, and sync_caps does not make it so.
        std::fs::remove_file(tmp.path().join("dev/nvidiactl")).unwrap();
        assert!(!is_current(&cfg, &st));
        sync_caps(&cfg, &mut st).unwrap();
        assert!(!is_current(&cfg, &st));
        layout(&cfg, &mut st).unwrap();
        assert!(is_current(&cfg, &st));
        assert!(tmp.path().join("dev/nvidiactl").exists());
    }

    /// As the driver (no `instance_caps`): instances make no node, and a node someone else
    /// makes in nvidia-caps (the prolog) neither goes away nor makes the layout stale.
    #[test]
    fn without_instance_caps_the_caps_folder_is_left_to_others() {
        if std::fs::metadata("/proc/self").map_or(true, |m| m.uid() != 0) {
            assert!(std::env::var_os("CI").is_none(), "mknod needs root");
            eprintln!("SKIP (needs root: mknod)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let cfg = Config::from_fixture_text(
            "state = \"state.json\"\ndev_dir = \"dev\"\n[[gpus]]\nmodel = \"H200-141GB\"\n",
            tmp.path(),
        )
        .unwrap();
        let mut st = State::fresh(&cfg.gpus, Default::default());
        layout(&cfg, &mut st).unwrap();
        let caps = tmp.path().join("dev/nvidia-caps");
        let names = || {
            let mut v: Vec<String> = std::fs::read_dir(&caps)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(), ["nvidia-cap1", "nvidia-cap2"]);
        st.create_gi(0, 19, None, crate::state::FaultSources { local: None })
            .unwrap();
        sync_caps(&cfg, &mut st).unwrap();
        assert_eq!(
            names(),
            ["nvidia-cap1", "nvidia-cap2"],
            "no node for the GI"
        );
        // The prolog makes the GI's node: the layout stays current, and keeps it.
        let minor = model::gi_access_minor(0, 13);
        let dfd = open_dir_at(None, &caps).unwrap();
        ensure_node(
            &dfd,
            &caps,
            &format!("nvidia-cap{minor}"),
            508,
            minor,
            0o444,
        )
        .unwrap();
        assert!(is_current(&cfg, &st));
        layout(&cfg, &mut st).unwrap();
        assert!(names().contains(&format!("nvidia-cap{minor}")));
    }
}
