//! Full and read-only filesystems (real tmpfs mounts; needs root).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use tenancy_accounting::verify_paths;
use tenancy_audit_log::{AnchorSet, AuditError, AuditLog, Event, Outcome, Record};
use tenancy_test_support::audit_logs::record;

macro_rules! need_root {
    () => {
        if !tenancy_test_support::requires_root("mounts a tmpfs") {
            return;
        }
    };
}

struct Mount(PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn mount_tmpfs(dir: &Path, size: &str) -> Mount {
    let st = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0700"),
            "tenancy-audit-test",
        ])
        .arg(dir)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    Mount(dir.to_path_buf())
}

fn rec() -> Record {
    record(Event::JobStart, Outcome::Success, "tenancy-prolog", 7).reason("x".repeat(300))
}

#[test]
fn full_filesystem_fails_closed_and_leaves_no_partial_record() {
    need_root!();
    let outer = tempfile::tempdir().unwrap();
    let _m = mount_tmpfs(outer.path(), "64k");
    let p = outer.path().join("audit.jsonl");
    let mut log = AuditLog::open(&p).unwrap();
    log.append(&mut rec()).unwrap();
    // fill the filesystem
    let mut filler = std::fs::File::create(outer.path().join("filler")).unwrap();
    let chunk = vec![0u8; 4096];
    while filler.write_all(&chunk).is_ok() {}
    let _ = filler.write_all(&chunk[..1]);
    // append until the log's last page is full too
    let mut err = None;
    for _ in 0..64 {
        let before = std::fs::metadata(&p).unwrap().len();
        match log.append(&mut rec()) {
            Ok(_) => continue,
            Err(e) => {
                assert_eq!(
                    std::fs::metadata(&p).unwrap().len(),
                    before,
                    "partial record left behind"
                );
                err = Some(e);
                break;
            }
        }
    }
    let e = err.expect("append on a full filesystem must fail");
    assert!(
        matches!(e, AuditError::Write { .. } | AuditError::Sync { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("read-only or full"), "{e}");
    let r = verify_paths(std::slice::from_ref(&p), &AnchorSet::default(), 10).unwrap();
    assert!(r.is_clean(), "{:?}", r.findings);
}

#[test]
fn read_only_filesystem_fails_closed() {
    need_root!();
    let outer = tempfile::tempdir().unwrap();
    let _m = mount_tmpfs(outer.path(), "64k");
    let p = outer.path().join("audit.jsonl");
    AuditLog::open(&p).unwrap().append(&mut rec()).unwrap();
    let st = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(outer.path())
        .status()
        .unwrap();
    assert!(st.success());
    let e = AuditLog::open(&p).unwrap_err();
    assert!(matches!(e, AuditError::Open { .. }), "{e}");
    assert!(e.to_string().contains("Read-only"), "{e}");
}
