//! The log on a real file system that runs full (a small tmpfs the test mounts; root only):
//! an append that meets ENOSPC, whole or after part of its record (a short write), returns
//! Err and leaves the log as it was, byte for byte; the next append, once there is room,
//! goes on with the chain. The soak's `audit_disk_full` fault relies on it
//! (crates/testing/e2e/src/soak/faults.rs).

use std::io::Write;
use std::path::Path;
use std::process::Command;
use tenancy_audit_log::record::{check_line_hash, LineHash};
use tenancy_audit_log::{AuditLog, Event, Outcome, Record, GENESIS};

fn rec(job: u64, reason: &str) -> Record {
    Record::new(
        "c1",
        "gpu001",
        "alice",
        2001,
        Event::JobStart,
        Outcome::Success,
        "tenancy-prolog",
    )
    .job_id(job)
    .reason(reason)
}

/// A tmpfs of `size` at `dir`, unmounted on drop.
struct Tmpfs<'a>(&'a Path);

impl Drop for Tmpfs<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0).status();
    }
}

/// Writes a filler until the file system is full (ENOSPC).
fn fill(dir: &Path) {
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let block = [0u8; 512];
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
}

/// Every line's own hash holds and each names the one before as `prev`, seq 1, 2, ...
fn assert_chain(log: &Path) {
    let text = std::fs::read(log).unwrap();
    assert_eq!(text.last(), Some(&b'\n'), "the log ends inside a record");
    let mut prev = GENESIS.to_string();
    for (i, line) in text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        let LineHash::Valid(hash) = check_line_hash(line) else {
            panic!("line {}: {:?}", i + 1, check_line_hash(line));
        };
        let v: serde_json::Value = serde_json::from_slice(line).unwrap();
        assert_eq!(v["seq"].as_u64(), Some(i as u64 + 1), "line {}", i + 1);
        assert_eq!(v["prev"].as_str(), Some(prev.as_str()), "line {}", i + 1);
        prev = hash.to_string();
    }
}

#[test]
fn an_append_that_meets_a_full_disk_leaves_the_chain_whole() {
    if !rustix::process::geteuid().is_root() {
        eprintln!(
            "SKIP an_append_that_meets_a_full_disk_leaves_the_chain_whole: needs root (mount)"
        );
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("fs");
    std::fs::create_dir(&dir).unwrap();
    let st = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=64k,mode=0700",
            "tenancy-audit-full",
        ])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success(), "mount a tmpfs on {}", dir.display());
    let _fs = Tmpfs(&dir);
    let p = dir.join("audit.jsonl");
    let mut log = AuditLog::open(&p).unwrap();
    log.append(&mut rec(1, "first")).unwrap();
    fill(&dir);
    let before = std::fs::read(&p).unwrap();
    // The room left in the log's last page takes a short record, not a long one: its write
    // stops short (or fails at once), and the append takes its bytes out again.
    let room = 4096 - before.len() % 4096;
    let long = "x".repeat(room + 8192);
    let e = log.append(&mut rec(2, &long)).unwrap_err();
    assert!(e.to_string().contains("audit log"), "{e}");
    assert_eq!(std::fs::read(&p).unwrap(), before, "an Err left bytes in");
    assert_eq!(log.head().unwrap().seq, 1);
    // What fits is written and chained (a real full disk still has its last block's room).
    let fits = log.append(&mut rec(3, "short")).unwrap();
    assert_eq!(fits.seq, 2);
    assert_chain(&p);
    // Room again: the chain goes on where it stood.
    std::fs::remove_file(dir.join("filler")).unwrap();
    let again = log.append(&mut rec(4, &long)).unwrap();
    assert_eq!(again.seq, 3);
    assert_chain(&p);
    // A writer opening the log afresh finds the same head.
    assert_eq!(AuditLog::open(&p).unwrap().head().unwrap().seq, 3);
}
