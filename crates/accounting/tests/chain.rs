//! Append, hash chain, tampering detection, anchors, concurrency.

use std::io::Write;
use std::path::Path;

use tenancy_accounting::{verify_paths, FindingKind};
use tenancy_audit_log::record::{check_line_hash, LineHash};
use tenancy_audit_log::{
    anchor_line, send_anchor_to, AnchorSet, AuditError, AuditLog, Event, Outcome, Record,
    SyslogStatus, GENESIS,
};
use tenancy_test_support::audit_logs::{job_start as rec, lines, make_log, write_lines};

fn verify(p: &Path, anchors: &AnchorSet) -> tenancy_accounting::VerifyReport {
    verify_paths(&[p.to_path_buf()], anchors, 100).unwrap()
}

#[test]
fn append_fills_chain_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 5);
    let ls = lines(&p);
    assert_eq!(ls.len(), 5);
    let mut prev = GENESIS.to_string();
    for (i, l) in ls.iter().enumerate() {
        let r: Record = serde_json::from_str(l).unwrap();
        assert_eq!(r.seq, i as u64 + 1);
        assert_eq!(r.prev, prev);
        // canonical form: line minus `,"hash":"…"` hashes to the stored hash
        let cut = l.rfind(",\"hash\":\"").unwrap();
        let canonical = format!("{}}}", &l[..cut]);
        assert_eq!(
            tenancy_audit_log::record::canonical_hash(canonical.as_bytes()),
            r.hash
        );
        assert!(matches!(check_line_hash(l.as_bytes()), LineHash::Valid(_)));
        assert!(l.ends_with(&format!(",\"hash\":\"{}\"}}", r.hash)));
        assert_eq!(r.reason.as_deref(), Some("line\nbreak \"quoted\" ünïcode"));
        assert_eq!(r.resources[0].detail["ci"], 0);
        prev = r.hash.clone();
    }
    let log = AuditLog::open(&p).unwrap();
    assert_eq!(log.head().unwrap().seq, 5);
    assert_eq!(log.head().unwrap().hash, prev);
    // unknown fields are tolerated on read
    let mut v: serde_json::Value = serde_json::from_str(&ls[0]).unwrap();
    v["future_field"] = 1.into();
    v["event"] = "quota_warning".into();
    let r: Record = serde_json::from_value(v).unwrap();
    assert_eq!(r.event, Event::Other("quota_warning".into()));
    assert!(serde_json::from_str::<Record>(&ls[0].replace("job_start", "Job Start")).is_err());
    // file mode 0640
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert!(verify(&p, &AnchorSet::default()).is_clean());
}

#[test]
fn open_refuses_missing_dir_and_symlink() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        AuditLog::open(dir.path().join("nope/x.log")),
        Err(AuditError::Open { .. })
    ));
    let target = dir.path().join("target");
    std::fs::write(&target, "").unwrap();
    std::os::unix::fs::symlink(&target, dir.path().join("link")).unwrap();
    let e = AuditLog::open(dir.path().join("link")).unwrap_err();
    assert!(matches!(e, AuditError::Open { .. }), "{e}");
}

#[test]
fn torn_tail_is_cut_and_recorded_by_the_next_append() {
    // A writer killed inside its write(2) leaves a record cut short; the next append removes
    // those bytes, says so in the chain, and the log verifies (it no longer blocks the node).
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 3);
    let whole = std::fs::read(&p).unwrap();
    let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(b"{\"seq\":4,\"ti").unwrap();
    let a = AuditLog::open(&p).unwrap().append(&mut rec(4)).unwrap();
    assert_eq!(a.seq, 5, "seq 4 is the note of the cut");
    let text = std::fs::read(&p).unwrap();
    assert!(text.starts_with(&whole), "a complete record was touched");
    let ls = lines(&p);
    assert_eq!(ls.len(), 5);
    let note: Record = serde_json::from_str(&ls[3]).unwrap();
    assert_eq!(note.event, Event::Other("torn_record_removed".into()));
    assert!(note.reason.unwrap().contains("12 byte(s)"));
    assert!(verify(&p, &AnchorSet::default()).is_clean());
}

#[test]
fn edited_field_detected_at_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 10);
    let mut ls = lines(&p);
    ls[6] = ls[6].replace("\"user\":\"alice\"", "\"user\":\"mallory\"");
    write_lines(&p, &ls);
    let r = verify(&p, &AnchorSet::default());
    assert_eq!(r.total_findings, 1, "{:?}", r.findings);
    let f = r.first().unwrap();
    assert_eq!((f.line, f.seq), (7, Some(7)));
    assert!(matches!(f.kind, FindingKind::HashMismatch { .. }));
}

#[test]
fn rehashed_edit_breaks_the_next_prev() {
    // The attacker recomputes the edited record's hash but not the rest of the chain.
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 10);
    let mut ls = lines(&p);
    let mut r: Record = serde_json::from_str(&ls[3]).unwrap();
    r.user = "mallory".into();
    let prev = r.prev.clone();
    ls[3] = String::from_utf8(r.seal(4, &prev).unwrap())
        .unwrap()
        .trim_end()
        .to_string();
    write_lines(&p, &ls);
    let rep = verify(&p, &AnchorSet::default());
    let f = rep.first().unwrap();
    assert_eq!((f.line, f.seq), (5, Some(5)));
    assert!(matches!(f.kind, FindingKind::PrevMismatch { .. }), "{f}");
}

#[test]
fn deleted_record_detected() {
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 10);
    let mut ls = lines(&p);
    ls.remove(4); // seq 5
    write_lines(&p, &ls);
    let r = verify(&p, &AnchorSet::default());
    assert_eq!(r.total_findings, 1, "{:?}", r.findings);
    let f = r.first().unwrap();
    assert_eq!((f.line, f.seq), (5, Some(6)));
    assert_eq!(
        f.kind,
        FindingKind::SeqGap {
            expected: 5,
            found: 6
        }
    );
}

#[test]
fn swapped_records_detected() {
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 10);
    let mut ls = lines(&p);
    ls.swap(2, 3); // seq 3 and 4
    write_lines(&p, &ls);
    let r = verify(&p, &AnchorSet::default());
    let f = r.first().unwrap();
    assert_eq!((f.line, f.seq), (3, Some(4)));
    assert_eq!(
        f.kind,
        FindingKind::Reordered {
            expected: 3,
            found: 4
        }
    );
    assert_eq!(
        r.findings[1].kind,
        FindingKind::Reordered {
            expected: 5,
            found: 3
        }
    );
    assert_eq!(r.findings[1].line, 4);
}

#[test]
fn malformed_line_detected() {
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 6);
    let mut ls = lines(&p);
    ls.insert(2, "garbage".into());
    write_lines(&p, &ls);
    let r = verify(&p, &AnchorSet::default());
    let f = r.first().unwrap();
    assert_eq!(f.line, 3);
    assert!(matches!(f.kind, FindingKind::Malformed { .. }));
}

#[test]
fn cut_tail_detected_only_with_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 10);
    let head = AuditLog::open(&p).unwrap().head().unwrap();
    let anchor_file = dir.path().join("anchors/anchors.log");
    std::fs::create_dir(dir.path().join("anchors")).unwrap();
    // no syslog socket here: status says so, the file still gets the anchor
    let st = send_anchor_to(
        &dir.path().join("no-such-socket"),
        "gpu001",
        head.seq,
        &head.hash,
        Some(&anchor_file),
        None,
    );
    assert!(matches!(st.syslog, SyslogStatus::Unavailable(_)));
    assert_eq!(st.file, Some(Ok(())));
    let mut ls = lines(&p);
    ls.truncate(7);
    write_lines(&p, &ls);
    assert!(
        verify(&p, &AnchorSet::default()).is_clean(),
        "a chain alone cannot see a cut tail"
    );
    let mut anchors = AnchorSet::default();
    // an older anchor (syslog-style line) holds too: the newest tells of the cut
    let rec3: Record = serde_json::from_str(&lines(&p)[2]).unwrap();
    let older = format!(
        "Nov 29 18:50:00 gpu001 tenancy-audit[42]: {}\n",
        anchor_line("gpu001", 3, &rec3.hash)
    );
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&anchor_file)
        .unwrap();
    f.write_all(older.as_bytes()).unwrap();
    assert_eq!(anchors.read_file(&anchor_file).unwrap(), 2);
    let r = verify(&p, &anchors);
    assert_eq!(r.total_findings, 1, "{:?}", r.findings);
    let f = r.first().unwrap();
    assert_eq!((f.line, f.seq), (8, Some(8)));
    assert!(matches!(
        f.kind,
        FindingKind::TruncatedTail {
            last_seq: 7,
            anchor_seq: 10,
            ..
        }
    ));
}

#[test]
fn rewritten_chain_caught_by_anchor() {
    // Attacker deletes record 4 and re-seals everything after it: chain valid, anchor not.
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 8);
    let head = AuditLog::open(&p).unwrap().head().unwrap();
    let mut anchors = AnchorSet::default();
    anchors.add("gpu001".into(), head.seq, head.hash.clone(), "test".into());
    let ls = lines(&p);
    let mut out = Vec::new();
    let mut prev = GENESIS.to_string();
    let mut seq = 0;
    for (i, l) in ls.iter().enumerate() {
        if i == 3 {
            continue;
        }
        let mut r: Record = serde_json::from_str(l).unwrap();
        seq += 1;
        let line = r.seal(seq, &prev).unwrap();
        prev = r.hash.clone();
        out.push(String::from_utf8(line).unwrap().trim_end().to_string());
    }
    write_lines(&p, &out);
    assert!(verify(&p, &AnchorSet::default()).is_clean());
    let r = verify(&p, &anchors);
    assert!(matches!(
        r.first().unwrap().kind,
        FindingKind::TruncatedTail {
            last_seq: 7,
            anchor_seq: 8,
            ..
        }
    ));
    // and with an anchor inside the surviving range the rewrite is a hash mismatch at that seq
    let mut a2 = AnchorSet::default();
    let orig5: Record = serde_json::from_str(&ls[4]).unwrap();
    a2.add("gpu001".into(), 5, orig5.hash, "test".into());
    let r = verify(&p, &a2);
    let f = r.first().unwrap();
    assert_eq!(f.line, 5);
    assert!(matches!(f.kind, FindingKind::AnchorMismatch { seq: 5, .. }));
}

/// Seals every record again after `edit`: a valid chain, with new hashes from the edit on.
fn rechain(p: &Path, edit: impl Fn(&mut Record)) {
    let mut prev = GENESIS.to_string();
    let mut out = Vec::new();
    for l in lines(p) {
        let mut r: Record = serde_json::from_str(&l).unwrap();
        edit(&mut r);
        let seq = r.seq;
        let line = r.seal(seq, &prev).unwrap();
        prev = r.hash.clone();
        out.push(String::from_utf8(line).unwrap().trim_end().to_string());
    }
    write_lines(p, &out);
}

fn syslog_line(seq: u64, hash: &str) -> String {
    format!(
        "Nov 29 18:50:{:02} gpu001 tenancy-audit[42]: {}\n",
        seq % 60,
        anchor_line("gpu001", seq, hash)
    )
}

fn anchors_from(dir: &Path, syslog: &str) -> AnchorSet {
    let f = dir.join("syslog");
    std::fs::write(&f, syslog).unwrap();
    let mut a = AnchorSet::default();
    a.read_file(&f).unwrap();
    a
}

#[test]
fn older_anchors_catch_a_rewrite_after_a_newer_head() {
    // Record 2 edited and the chain re-sealed to the end; the next job end then anchors the
    // new head normally. Only the anchors older than it still know the old hashes.
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 5);
    let mut syslog: String = lines(&p)
        .iter()
        .map(|l| serde_json::from_str::<Record>(l).unwrap())
        .map(|r| syslog_line(r.seq, &r.hash))
        .collect();
    rechain(&p, |r| {
        if r.seq == 2 {
            r.tenant = Some("other".into());
        }
    });
    let a6 = AuditLog::open(&p)
        .unwrap()
        .with_fsync(false)
        .append(&mut rec(6))
        .unwrap();
    syslog += &syslog_line(a6.seq, &a6.hash);
    let r = verify(&p, &anchors_from(dir.path(), &syslog));
    assert_eq!(r.total_findings, 4, "{:?}", r.findings);
    for (f, seq) in r.findings.iter().zip(2..) {
        assert_eq!((f.line, f.seq), (seq, Some(seq)));
        assert!(
            matches!(f.kind, FindingKind::AnchorMismatch { seq: s, .. } if s == seq),
            "{f}"
        );
    }
    assert_eq!(r.nodes[0].anchor_seq, Some(6));
}

#[test]
fn cut_and_regrown_tail_caught_by_its_older_anchor() {
    // Records 3..5 cut, then the log grows past the cut again, each new head anchored.
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 5);
    let head = AuditLog::open(&p).unwrap().head().unwrap();
    let mut syslog = syslog_line(5, &head.hash);
    let mut ls = lines(&p);
    ls.truncate(2);
    write_lines(&p, &ls);
    let mut log = AuditLog::open(&p).unwrap().with_fsync(false);
    for i in 103..=106 {
        let a = log.append(&mut rec(i)).unwrap();
        syslog += &syslog_line(a.seq, &a.hash);
    }
    let r = verify(&p, &anchors_from(dir.path(), &syslog));
    assert_eq!(r.total_findings, 2, "{:?}", r.findings);
    let (c, m) = (&r.findings[0], &r.findings[1]);
    assert_eq!((c.line, c.seq, m.line, m.seq), (5, Some(5), 5, Some(5)));
    match &c.kind {
        FindingKind::ConflictingAnchors { seq: 5, hashes, .. } => {
            assert!(hashes.contains(&head.hash), "{c}")
        }
        _ => panic!("{c}"),
    }
    assert!(
        matches!(&m.kind, FindingKind::AnchorMismatch { seq: 5, anchor_hash, .. } if *anchor_hash == head.hash),
        "{m}"
    );
}

#[test]
fn conflicting_anchors_past_the_end_and_a_repeated_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 3);
    let head = AuditLog::open(&p).unwrap().head().unwrap();
    // the same anchor in syslog and in the anchor file is one anchor
    let same = syslog_line(3, &head.hash).repeat(2);
    let r = verify(&p, &anchors_from(dir.path(), &same));
    assert!(r.is_clean(), "{:?}", r.findings);
    let forked = format!(
        "{same}{}{}",
        syslog_line(7, &"a".repeat(64)),
        syslog_line(7, &"b".repeat(64))
    );
    let r = verify(&p, &anchors_from(dir.path(), &forked));
    assert_eq!(r.total_findings, 2, "{:?}", r.findings);
    assert!(matches!(
        r.findings[0].kind,
        FindingKind::TruncatedTail {
            last_seq: 3,
            anchor_seq: 7,
            ..
        }
    ));
    let f = &r.findings[1];
    assert_eq!((f.line, f.seq), (4, Some(7)));
    assert!(
        matches!(&f.kind, FindingKind::ConflictingAnchors { seq: 7, hashes, anchors }
            if hashes.len() == 2 && anchors[1].ends_with("syslog:4")),
        "{f}"
    );
}

#[test]
fn syslog_anchor_reaches_a_datagram_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("log.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    let st = send_anchor_to(&sock_path, "gpu001", 42, &"b".repeat(64), None, None);
    assert_eq!(st.syslog, SyslogStatus::Sent);
    assert_eq!(st.file, None);
    let mut buf = [0u8; 1024];
    let n = sock.recv(&mut buf).unwrap();
    let msg = std::str::from_utf8(&buf[..n]).unwrap();
    assert!(msg.starts_with("<86>"), "{msg}");
    assert!(
        msg.contains(&format!(
            " tenancy-audit[{}]: node=gpu001 seq=42 hash={}",
            std::process::id(),
            "b".repeat(64)
        )),
        "{msg}"
    );
    assert_eq!(
        tenancy_audit_log::parse_anchor_line(msg),
        Some(("gpu001".to_string(), 42, "b".repeat(64)))
    );
    let st = send_anchor_to(&sock_path, "bad node", 1, &"b".repeat(64), None, None);
    assert!(matches!(st.syslog, SyslogStatus::Rejected(_)));
}

const THREADS: usize = 32;
const PER_THREAD: usize = 40;

fn check_all_present(p: &Path, writers: &[String], per: usize) {
    let r = verify(p, &AnchorSet::default());
    assert!(r.is_clean(), "{:?}", r.findings);
    assert_eq!(r.nodes[0].records as usize, writers.len() * per);
    let mut seen = std::collections::HashSet::new();
    for l in lines(p) {
        let rec: Record = serde_json::from_str(&l).unwrap();
        assert!(
            seen.insert((rec.origin.clone(), rec.job_id)),
            "duplicate {l}"
        );
    }
    for w in writers {
        for i in 0..per as u64 {
            assert!(seen.contains(&(w.clone(), Some(i))), "lost record {w} {i}");
        }
    }
}

/// THREADS threads, each with its own handle on `p` (opened once), append PER_THREAD records
/// of origin `t<thread>` and job ids 0, 1...
fn append_from_threads(p: &Path) {
    let hs: Vec<_> = (0..THREADS)
        .map(|t| {
            let p = p.to_path_buf();
            std::thread::spawn(move || {
                let mut log = AuditLog::open(&p).unwrap();
                for i in 0..PER_THREAD as u64 {
                    let mut r = rec(i).job_id(i);
                    r.origin = format!("t{t}");
                    log.append(&mut r).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn concurrent_threads_each_with_own_handle() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gpu001.audit.jsonl");
    append_from_threads(&p);
    let names: Vec<String> = (0..THREADS).map(|t| format!("t{t}")).collect();
    check_all_present(&p, &names, PER_THREAD);
}

/// Child side of `concurrent_processes`: does nothing unless spawned with AUDIT_CHILD_LOG.
#[test]
fn child_appender() {
    let Ok(p) = std::env::var("AUDIT_CHILD_LOG") else {
        return;
    };
    let name = std::env::var("AUDIT_CHILD_NAME").unwrap();
    let n: u64 = std::env::var("AUDIT_CHILD_N").unwrap().parse().unwrap();
    for i in 0..n {
        // a fresh open per record, like one prolog process per job
        let mut log = AuditLog::open(&p).unwrap();
        let mut r = rec(i).job_id(i);
        r.origin = name.clone();
        log.append(&mut r).unwrap();
    }
}

#[test]
fn concurrent_processes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gpu001.audit.jsonl");
    let exe = std::env::current_exe().unwrap();
    let procs = 32;
    let per = 25;
    let children: Vec<_> = (0..procs)
        .map(|i| {
            std::process::Command::new(&exe)
                .args(["--exact", "child_appender", "--test-threads=1", "--quiet"])
                .env("AUDIT_CHILD_LOG", &p)
                .env("AUDIT_CHILD_NAME", format!("p{i}"))
                .env("AUDIT_CHILD_N", per.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let names: Vec<String> = (0..procs).map(|i| format!("p{i}")).collect();
    check_all_present(&p, &names, per);
}

// Rotation: `AuditLog::rotate` sets a log aside and starts a file that goes on with its chain.

fn all_lines(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for p in tenancy_accounting::expand_paths(&[dir.to_path_buf()]).unwrap() {
        out.extend(lines(&p));
    }
    out
}

#[test]
fn a_rotated_log_is_one_chain_across_its_files_and_its_newest_file_verifies_alone() {
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 5);
    let mut log = AuditLog::open(&p).unwrap().with_fsync(false);
    let r = log.rotate("root", 0, "tenancyctl").unwrap().unwrap();
    assert_eq!((r.rotated_seq, r.head.seq), (6, 7));
    assert_eq!((r.cluster.as_str(), r.node.as_str()), ("c1", "gpu001"));
    let kept = lines(&r.kept_as);
    assert_eq!(
        kept.len(),
        6,
        "the kept file ends with the log_rotated record"
    );
    let last: Record = serde_json::from_str(&kept[5]).unwrap();
    assert_eq!(last.event, Event::LogRotated);
    let fresh = lines(&p);
    assert_eq!(fresh.len(), 1);
    let first: Record = serde_json::from_str(&fresh[0]).unwrap();
    assert_eq!(
        (first.event, first.seq, &first.prev),
        (Event::LogContinued, 7, &last.hash)
    );
    // The new file took the old one's mode; no hidden file is left behind.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    // The same handle appends on in the new file.
    for i in 6..=8 {
        assert_eq!(log.append(&mut rec(i)).unwrap().seq, i + 2);
    }
    let all = verify_paths(&[dir.path().to_path_buf()], &AnchorSet::default(), 100).unwrap();
    assert!(all.is_clean(), "{:?}", all.findings);
    assert_eq!(all.nodes.len(), 1);
    assert_eq!((all.nodes[0].records, all.nodes[0].first_seq), (10, 1));
    assert_eq!(all.nodes[0].files, vec![r.kept_as.clone(), p.clone()]);
    // The kept file alone is a whole chain; the newest alone begins at its log_continued.
    assert!(verify(&r.kept_as, &AnchorSet::default()).is_clean());
    let in_order: Vec<String> = all.nodes[0].files.iter().flat_map(|f| lines(f)).collect();
    let anchors = anchors_from(
        dir.path(),
        &in_order
            .iter()
            .map(|l| {
                let r: Record = serde_json::from_str(l).unwrap();
                syslog_line(r.seq, &r.hash)
            })
            .collect::<String>(),
    );
    let newest = verify(&p, &anchors);
    assert!(newest.is_clean(), "{:?}", newest.findings);
    let n = &newest.nodes[0];
    assert_eq!((n.records, n.first_seq, n.last_seq), (4, 7, 10));
    assert_eq!(n.anchors_before_first, 6);
    assert!(n
        .continues
        .as_deref()
        .unwrap()
        .contains("whose last record is seq 6"));
    // Records cut from the front of a file are still a gap: only a log_continued begins a chain.
    let cut = dir.path().join("cut");
    std::fs::create_dir(&cut).unwrap();
    let q = cut.join("gpu001.audit.jsonl");
    write_lines(&q, &lines(&r.kept_as)[2..]);
    let f = verify(&q, &AnchorSet::default());
    assert!(matches!(
        f.first().unwrap().kind,
        FindingKind::SeqGap {
            expected: 1,
            found: 3
        }
    ));
    // A log_continued record edited into the front does not pass either: its prev is checked
    // against nothing, but its own hash and the next record's prev are.
    let mut forged: Record = serde_json::from_str(&lines(&r.kept_as)[2]).unwrap();
    forged.event = Event::LogContinued;
    let mut l = lines(&r.kept_as)[2..].to_vec();
    l[0] = String::from_utf8(forged.seal(3, &forged.prev.clone()).unwrap())
        .unwrap()
        .trim_end()
        .to_string();
    write_lines(&q, &l);
    let f = verify(&q, &AnchorSet::default());
    assert!(
        matches!(f.first().unwrap().kind, FindingKind::PrevMismatch { .. }),
        "{:?}",
        f.findings
    );
}

#[test]
fn an_append_that_held_the_old_file_goes_to_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 3);
    // Opened before the rotation, as a prolog that waited on the lock meanwhile.
    let mut waiting = AuditLog::open(&p).unwrap().with_fsync(false);
    let r = AuditLog::open(&p)
        .unwrap()
        .rotate("root", 0, "tenancyctl")
        .unwrap()
        .unwrap();
    assert_eq!(waiting.append(&mut rec(4)).unwrap().seq, 6);
    assert_eq!(
        lines(&r.kept_as).len(),
        4,
        "nothing after the log_rotated record"
    );
    assert_eq!(lines(&p).len(), 2);
    let all = verify_paths(&[dir.path().to_path_buf()], &AnchorSet::default(), 100).unwrap();
    assert!(all.is_clean(), "{:?}", all.findings);
    // An empty log has nothing to set aside.
    let e = dir.path().join("empty");
    std::fs::create_dir(&e).unwrap();
    let mut empty = AuditLog::open(e.join("gpu001.audit.jsonl")).unwrap();
    assert!(empty.rotate("root", 0, "tenancyctl").unwrap().is_none());
}

#[test]
fn a_rotation_that_stopped_before_replacing_the_file_leaves_one_chain() {
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), 2);
    // What a rotation leaves when it stops after sealing the file (killed, or the rename
    // refused): the log_rotated record, and the file still at the path.
    let mut log = AuditLog::open(&p).unwrap().with_fsync(false);
    let mut sealed = Record::new(
        "c1",
        "gpu001",
        "root",
        0,
        Event::LogRotated,
        Outcome::Success,
        "tenancyctl",
    );
    log.append(&mut sealed).unwrap();
    assert_eq!(log.append(&mut rec(3)).unwrap().seq, 4);
    assert_eq!(lines(&p).len(), 4);
    assert!(verify(&p, &AnchorSet::default()).is_clean());
}

#[test]
fn appends_from_many_threads_through_repeated_rotations_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gpu001.audit.jsonl");
    make_log(dir.path(), 1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rotator = {
        let (p, stop) = (p.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut log = AuditLog::open(&p).unwrap();
                if log.rotate("root", 0, "tenancyctl").unwrap().is_some() {
                    n += 1;
                }
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            n
        })
    };
    // One handle for all records: most appends hold a file rotated away since.
    append_from_threads(&p);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rotations = rotator.join().unwrap();
    assert!(rotations >= 2, "only {rotations} rotation(s) happened");
    let all = verify_paths(&[dir.path().to_path_buf()], &AnchorSet::default(), 100).unwrap();
    assert!(all.is_clean(), "{:?}", all.findings);
    assert_eq!(all.nodes[0].files.len(), rotations + 1);
    let mut seen = std::collections::HashSet::new();
    for l in all_lines(dir.path()) {
        let r: Record = serde_json::from_str(&l).unwrap();
        if r.origin
            .strip_prefix('t')
            .is_some_and(|n| n.parse::<usize>().is_ok())
        {
            assert!(seen.insert((r.origin, r.job_id)), "duplicate {l}");
        }
    }
    assert_eq!(seen.len(), THREADS * PER_THREAD, "records lost");
}
