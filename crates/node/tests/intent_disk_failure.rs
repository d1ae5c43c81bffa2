//! The disk under the state folder fails the intent log's writes: the prolog must fail closed
//! before it makes anything that outlives a restart (the scratch folder), and roll back what it
//! made while the intents were being written (the job's cgroup with its device program, its
//! place under the tenant's nft rules). The failing disk is real: an ext4 file system (no
//! journal) on a loop device whose backing file lives on a small tmpfs; the tmpfs is filled and
//! the intent log's blocks are punched out of the backing file, so writing them back fails.

mod common;

use common::{requires_root, text, World};
use std::path::{Path, PathBuf};
use std::process::Command;
use tenancy_audit_log::Event;

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An ext4 on a loop device mounted at `at`, its backing file on a tmpfs of its own; unmounted
/// and detached on drop.
struct LoopDisk {
    at: PathBuf,
    tmpfs: PathBuf,
    device: String,
}

impl LoopDisk {
    fn mount(at: &Path, tmpfs: &Path) -> LoopDisk {
        std::fs::create_dir_all(at).unwrap();
        std::fs::create_dir_all(tmpfs).unwrap();
        run(
            "mount",
            &["-t", "tmpfs", "-o", "size=16m", "tmpfs", s(tmpfs)],
        );
        // From here on, a failing step still unmounts what was mounted (drop).
        let mut disk = LoopDisk {
            at: at.to_path_buf(),
            tmpfs: tmpfs.to_path_buf(),
            device: String::new(),
        };
        let image = tmpfs.join("disk");
        run("truncate", &["-s", "12m", s(&image)]);
        run(
            "mkfs.ext4",
            &["-q", "-F", "-b", "4096", "-O", "^has_journal", s(&image)],
        );
        disk.device = run("losetup", &["--find", "--show", s(&image)])
            .trim()
            .to_string();
        run("mount", &["-o", "errors=continue", &disk.device, s(at)]);
        std::fs::set_permissions(at, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        disk
    }

    /// From now on, writing `file`'s blocks back to the disk fails (ENOSPC in the loop device,
    /// an I/O error to ext4); everything else on it is written already.
    fn fail_writes_to(&self, file: &Path) {
        run("sync", &["-f", s(file)]);
        let fill_up = |name: &str| {
            let mut f = std::fs::File::create(self.tmpfs.join(name)).unwrap();
            let page = [0u8; 4096];
            while std::io::Write::write_all(&mut f, &page).is_ok() {}
        };
        fill_up("filler");
        let extents = run("filefrag", &["-v", s(file)]);
        let mut punched = 0;
        for line in extents.lines() {
            // "   0:        0..      63:       1234..      1297:     64:   last,eof"
            let cols: Vec<&str> = line.split(':').map(str::trim).collect();
            if cols.len() < 4 || cols[0].parse::<u32>().is_err() {
                continue;
            }
            let (start, end) = cols[2].split_once("..").unwrap();
            let (start, end): (u64, u64) =
                (start.trim().parse().unwrap(), end.trim().parse().unwrap());
            run(
                "fallocate",
                &[
                    "--punch-hole",
                    "--keep-size",
                    "--offset",
                    &(start * 4096).to_string(),
                    "--length",
                    &((end - start + 1) * 4096).to_string(),
                    s(&self.tmpfs.join("disk")),
                ],
            );
            punched += 1;
        }
        assert!(
            punched > 0,
            "no extent of {} in:\n{extents}",
            file.display()
        );
        // The punched pages went back to the tmpfs: take them.
        fill_up("filler2");
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        // Room again, so that what is still dirty can be written before the unmount.
        let _ = std::fs::remove_file(self.tmpfs.join("filler"));
        let _ = std::fs::remove_file(self.tmpfs.join("filler2"));
        let _ = Command::new("umount").arg(&self.at).status();
        if !self.device.is_empty() {
            let _ = Command::new("losetup").args(["-d", &self.device]).status();
        }
        let _ = Command::new("umount").arg(&self.tmpfs).status();
    }
}

/// Why no loop device can be attached here (a container without /dev/loop-control, say), if
/// one cannot: this test then has no failing disk to run on.
fn no_loop_device() -> Option<String> {
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing".into());
    }
    match Command::new("losetup").arg("--find").output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!("losetup --find: {}", text(&out).trim())),
        Err(e) => Some(format!("losetup: {e}")),
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_prolog_whose_intents_cannot_reach_the_disk_fails_closed_before_scratch() {
    if !requires_root("loop devices, mounts, real users, product cgroups") {
        return;
    }
    if let Some(why) = no_loop_device() {
        eprintln!("SKIP (no loop device to fail: {why})");
        return;
    }
    let Some(w) = World::new(1, None) else { return };
    let state = w.root.join("state");
    // Declared after the world: unmounted before the world's folder is removed.
    let disk = LoopDisk::mount(&state, &w.root.join("disk-tmpfs"));

    // A job on the healthy disk makes the intent log (its blocks allocated and written).
    let out = w.run(&["prolog"], &w.job_env(1, 0, None));
    assert!(out.status.success(), "{}", text(&out));
    let out = w.run(&["epilog"], &w.job_env(1, 0, None));
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after a job on the healthy disk");

    disk.fail_writes_to(&state.join(tenancy_job::intent_log::FILE));
    let out = w.run(&["prolog"], &w.job_env(2, 0, None));
    assert!(!out.status.success(), "the prolog ran: {}", text(&out));
    let said = text(&out);
    let want = format!(
        "job 2: layer scratch: the intents did not reach the disk in {}",
        state.display()
    );
    assert!(said.contains(&want), "{said}");
    // The layers a restart removes acted while the intents were written; the wait failed, so
    // the scratch folder was never started.
    assert!(said.contains("made network"), "{said}");
    assert!(!said.contains("intents-on-disk"), "{said}");
    assert!(!said.contains("intended scratch"), "{said}");
    // Fail closed: what was made is undone, nothing of the job is left.
    assert!(!w.cgroup(0, 2).exists(), "the job's cgroup is left");
    assert!(!w.scratch_dir(0, 2).exists(), "a scratch folder was made");
    w.assert_nothing_left("after the prolog that failed");
    let recs = w.records();
    let last = recs.last().unwrap();
    assert_eq!(
        (last.job_id, &last.event),
        (Some(2), &Event::Rollback),
        "{recs:?}"
    );
    assert!(
        last.reason
            .as_deref()
            .is_some_and(|r| r.contains("did not reach the disk")),
        "{last:?}"
    );
    assert!(w.chain_is_valid(), "audit chain broken");
    drop(disk);
}
