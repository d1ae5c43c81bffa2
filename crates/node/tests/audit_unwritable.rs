//! The audit log on a small tmpfs the test mounts, then fills up or remounts read-only.
//!
//! The prolog fails closed: no job runs without its job_start record, and what the layers made
//! is rolled back (no GPU instance, cgroup, scratch folder or journal is left). The epilog
//! (ARCHITECTURE.md, "Epilog when the audit log cannot be written") still tears everything down,
//! says the record is missing, and exits 0. Once the log is writable again the chain verifies.

mod common;

use common::{requires_root, text, World};
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use tenancy_audit_log::Event;

/// A tmpfs mounted for the test; unmounted on drop.
struct Tmpfs {
    dir: PathBuf,
    /// Holds the mount point; removed after the unmount in `drop`.
    _base: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let base = tempfile::Builder::new()
            .prefix("rl-auditfs")
            .tempdir()
            .unwrap();
        let dir = &base.path().join("fs");
        std::fs::create_dir_all(dir).unwrap();
        let opts = format!("size={size},mode=0700");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "tenancy-test-audit"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs on {}", dir.display());
        Tmpfs {
            dir: dir.to_path_buf(),
            _base: base,
        }
    }

    fn remount(&self, mode: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,{mode}")])
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(st.success(), "remount {mode}");
    }

    /// Writes a filler file until the filesystem is full.
    fn fill(&self) {
        let mut f = std::fs::File::create(self.dir.join("filler")).unwrap();
        let block = vec![0u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(28), "filling: {e}");
                    break;
                }
            }
        }
        let _ = f.sync_all();
    }

    fn unfill(&self) {
        std::fs::remove_file(self.dir.join("filler")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

fn world_with_tmpfs_log() -> Option<(World, Tmpfs)> {
    let fs = Tmpfs::mount("256k");
    let w = World::new(2, Some(&fs.dir.join("audit.jsonl")))?;
    Some((w, fs))
}

fn fails_closed(w: &World, job: u64, why: &str) {
    let out = w.run(&["prolog"], &w.job_env(job, 0, Some("1g.18gb")));
    assert_eq!(out.status.code(), Some(1), "{why}: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("audit"),
        "{why}: the message must name the audit log: {err}"
    );
    assert!(err.contains("rolled back"), "{why}: {err}");
    w.assert_nothing_left(why);
}

#[test]
fn a_full_or_read_only_audit_log_fails_the_prolog_closed() {
    if !requires_root("mount tmpfs, real users, product cgroups") {
        return;
    }
    let Some((w, fs)) = world_with_tmpfs_log() else {
        return;
    };
    // Full before the first record: the job's layers are made, then rolled back.
    fs.fill();
    fails_closed(&w, 501, "audit fs full");
    fs.unfill();

    // Read-only.
    fs.remount("ro");
    fails_closed(&w, 502, "audit fs read-only");
    fs.remount("rw");

    // Writable again: the next job runs, the chain is intact.
    let env = w.job_env(503, 1, Some("1g.18gb"));
    let out = w.run(&["prolog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    let out = w.run(&["epilog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after a normal job");
    let events: Vec<Event> = w.records().iter().map(|r| r.event.clone()).collect();
    // The failed prologs wrote nothing (not even their rollback record): the log holds only
    // whole records.
    assert_eq!(events, [Event::JobStart, Event::JobEnd]);
    assert!(w.chain_is_valid());
}

#[test]
fn the_epilog_tears_down_and_exits_zero_when_the_audit_log_cannot_be_written() {
    if !requires_root("mount tmpfs, real users, product cgroups") {
        return;
    }
    let Some((w, fs)) = world_with_tmpfs_log() else {
        return;
    };
    let env = w.job_env(601, 0, Some("1g.18gb"));
    let out = w.run(&["prolog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(w.gis().len(), 1);

    fs.remount("ro");
    let out = w.run(&["epilog"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("torn down") && said.contains("job_end record not written"),
        "the epilog must report the missing record: {}",
        text(&out)
    );
    w.assert_nothing_left("epilog with a read-only audit log");

    // A second job, its epilog with the log's filesystem full.
    fs.remount("rw");
    let env = w.job_env(602, 1, Some("1g.18gb"));
    let out = w.run(&["prolog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    fs.fill();
    let out = w.run(&["epilog"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    w.assert_nothing_left("epilog with a full audit log");
    fs.unfill();

    // What was written is whole and chained; the missing job_end of 601 is visible as a job
    // that started and never ended (602's may or may not have fit in the log's last page).
    let recs = w.records();
    let of = |job| -> Vec<Event> {
        recs.iter()
            .filter(|r| r.job_id == Some(job))
            .map(|r| r.event.clone())
            .collect()
    };
    assert_eq!(of(601), [Event::JobStart]);
    assert!(of(602).starts_with(&[Event::JobStart]));
    assert!(w.chain_is_valid());
}

/// The log's filesystem fills up in the middle of a record: the write is short, the audit log
/// cuts the partial line off again, the prolog rolls the job back, and the chain stays valid.
#[test]
fn a_record_cut_short_by_a_full_filesystem_is_undone_and_the_job_rolled_back() {
    if !requires_root("mount tmpfs, real users, product cgroups") {
        return;
    }
    let Some((w, fs)) = world_with_tmpfs_log() else {
        return;
    };
    let log = w.audit_path();
    let len = || std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    // One job, to learn a job_start's size.
    let mut job = 801;
    let env = w.job_env(job, 0, Some("1g.18gb"));
    let before = len();
    let out = w.run(&["prolog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    let start_len = len() - before;
    let out = w.run(&["epilog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    // Denials (short records) until the log's last page has some room, but less than a
    // job_start needs: the next job_start then fits only partly once no page is free.
    loop {
        let room = (4096 - len() % 4096) % 4096;
        eprintln!("log {} bytes, job_start {start_len}, room {room}", len());
        if room > 64 && room + 64 < start_len {
            break;
        }
        job += 1;
        assert!(job < 840, "never found a page with a partial record's room");
        let out = w.run(&["prolog"], &w.job_env(job, 0, Some("9g.999gb")));
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    }
    fs.fill();
    let before = len();
    job += 1;
    let out = w.run(&["prolog"], &w.job_env(job, 0, Some("1g.18gb")));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("short write"),
        "expected a short write of {start_len} bytes: {err}"
    );
    assert_eq!(len(), before, "the partial record was not cut off");
    w.assert_nothing_left("short write of job_start");
    fs.unfill();
    assert!(w.chain_is_valid());
    // And the log goes on.
    job += 1;
    let env = w.job_env(job, 1, Some("1g.18gb"));
    assert!(w.run(&["prolog"], &env).status.success());
    assert!(w.run(&["epilog"], &env).status.success());
    assert!(w.chain_is_valid());
}
