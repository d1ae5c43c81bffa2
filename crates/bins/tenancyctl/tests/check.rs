//! `tenancyctl check` as an admin runs it.

use std::process::Command;

const SAMPLE: &str = include_str!("../../../config/examples/tenancy.toml");

fn check(text: &str, format: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenancy.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tenancyctl"))
        .args(["check", "--config"])
        .arg(&path)
        .args(["--format", format])
        .env_remove("TENANCY_CONFIG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr)
            .unwrap()
            .replace(&path.display().to_string(), "FILE"),
    )
}

#[test]
fn accepts_the_sample_and_summarises_it() {
    let (code, out, _) = check(SAMPLE, "table");
    assert_eq!(code, 0);
    assert!(
        out.contains("OK: cluster demo, 2 tier(s), 2 tenant(s)"),
        "{out}"
    );
    assert!(out.contains("retain 30 days"), "{out}");
    let (code, out, _) = check(SAMPLE, "json");
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[1]["tenant"], "globex");
    assert_eq!(v[1]["share_gpu"], false);
    let (code, out, _) = check(SAMPLE, "csv");
    assert_eq!(code, 0);
    assert!(out.starts_with("tenant,tier,groups,"), "{out}");
}

#[test]
fn rejects_each_kind_of_bad_config_with_file_line_column() {
    let cases = [
        (
            "tier = \"internal\"",
            "tier = \"gold\"",
            "FILE:{L}:8: tenant 'acme' has unknown tier 'gold'",
        ),
        (
            "scratch_on_exit = \"wipe\"",
            "scratch_on_exit = \"wipe\"\nflavour = 1",
            "FILE:{L+1}:1: unknown field `flavour`",
        ),
        (
            "10.20.0.0/16:443/tcp",
            "10.20.0.0/40:443/tcp",
            "FILE:{L}:11: invalid destination \"10.20.0.0/40:443/tcp\"",
        ),
        (
            "10.20.0.0/16:443/tcp",
            "10.20.0.0/16:0/tcp",
            "is not in 1..=65535",
        ),
        (
            "[tenants.acme]",
            "[tenants.\"Acme Corp\"]",
            "FILE:{L}:10: bad tenant name 'Acme Corp'",
        ),
        (
            "groups = [\"globex\"]",
            "groups = [\"acme\"]",
            "group 'acme' is claimed by tenants 'acme' and 'globex'",
        ),
        (
            "\"/scratch\"",
            "\"./scratch\"",
            "FILE:{L}:16: cluster.scratch_root must be an absolute path",
        ),
    ];
    for (from, to, want) in cases {
        // Lines counted in the sample itself, so comments added to it move no case: {L} is
        // the line `from` is on, {L+1} the next.
        let line = 1 + SAMPLE.lines().position(|l| l.contains(from)).unwrap();
        let want = want
            .replace("{L+1}", &(line + 1).to_string())
            .replace("{L}", &line.to_string());
        let (code, _, err) = check(&SAMPLE.replacen(from, to, 1), "table");
        assert_eq!(code, 1, "{to}");
        assert!(err.contains(&want), "for {to}:\n{err}\nwant: {want}");
        assert!(err.contains('^'), "{err}");
    }
}
