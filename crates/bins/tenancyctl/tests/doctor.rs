//! `tenancyctl doctor` flags a node that could not isolate jobs.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use tenancy_test_support::TenancyToml;

#[test]
fn a_world_writable_scratch_root_fails_the_doctor() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let scratch = root.join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o777)).unwrap();
    let config = root.join("tenancy.toml");
    let mut text = TenancyToml::minimal("t", root);
    text.cluster()
        .nvml_library(root.join("no-such-libnvidia-ml.so.1"));
    std::fs::write(&config, text.to_string()).unwrap();
    // A PAM stack with pam_slurm_adopt (and one where it is only a comment).
    let pam = root.join("pam.d");
    std::fs::create_dir(&pam).unwrap();
    std::fs::write(
        pam.join("sshd"),
        "@include common-auth\naccount    required     pam_slurm_adopt.so action_no_jobs=deny\n",
    )
    .unwrap();
    std::fs::write(pam.join("login"), "# account required pam_slurm_adopt.so\n").unwrap();
    let (code, rows) = doctor(&config, &pam);
    assert_eq!(code, Some(1));
    let scratch_row = row(&rows, "scratch.root");
    assert_eq!(scratch_row["severity"], "error", "{scratch_row}");
    assert!(scratch_row["remedy"]
        .as_str()
        .unwrap()
        .contains("chmod go-w"));
    // pam_slurm_adopt: an isolation gap, named with its file and line (not the comment).
    let adopt = row(&rows, "slurm.pam_adopt");
    assert_eq!(adopt["severity"], "error", "{adopt}");
    let msg = adopt["message"].as_str().unwrap();
    assert!(msg.contains("sshd:2") && !msg.contains("login"), "{msg}");
    // With `tenancyctl adopt` required in the same service, adopted sessions join the job's
    // isolation: the check passes; an optional hook would let a refused session go on.
    let adopt_stack = "@include common-auth\naccount    required     pam_slurm_adopt.so\n";
    std::fs::write(
        pam.join("sshd"),
        format!("{adopt_stack}session optional pam_exec.so /usr/local/sbin/tenancyctl adopt\n"),
    )
    .unwrap();
    let (_, optional) = doctor(&config, &pam);
    assert_eq!(row(&optional, "slurm.pam_adopt")["severity"], "error");
    std::fs::write(
        pam.join("sshd"),
        format!(
            "{adopt_stack}session    required   pam_exec.so quiet /usr/local/sbin/tenancyctl adopt\n"
        ),
    )
    .unwrap();
    let (_, hooked) = doctor(&config, &pam);
    // (pam_slurm_adopt's defaults let a user in when adoption fails: a warning, below.)
    assert_eq!(row(&hooked, "slurm.pam_adopt_fallback")["severity"], "warn");
    let hooked = row(&hooked, "slurm.pam_adopt");
    assert_eq!(hooked["severity"], "ok", "{hooked}");
    assert!(
        hooked["message"].as_str().unwrap().contains("sshd:3"),
        "{hooked}"
    );
    // pam_slurm_adopt letting users in without a job: a warning naming the options, defaults
    // included; with every fallback denied, none.
    let session = "session required pam_exec.so /usr/local/bin/tenancyctl adopt\n";
    std::fs::write(
        pam.join("sshd"),
        format!("account required pam_slurm_adopt.so action_unknown=allow\n{session}"),
    )
    .unwrap();
    let (_, lax) = doctor(&config, &pam);
    let lax = row(&lax, "slurm.pam_adopt_fallback");
    assert_eq!(lax["severity"], "warn", "{lax}");
    let msg = lax["message"].as_str().unwrap();
    for want in [
        "sshd:1 action_unknown=allow",
        "sshd:1 action_adopt_failure=allow (the default)",
        "sshd:1 action_generic_failure=ignore (the default)",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    std::fs::write(
        pam.join("sshd"),
        format!(
            "account required pam_slurm_adopt.so action_no_jobs=deny action_adopt_failure=deny \
             action_generic_failure=deny\n{session}"
        ),
    )
    .unwrap();
    let (_, strict) = doctor(&config, &pam);
    assert!(
        strict
            .iter()
            .all(|r| r["check"] != "slurm.pam_adopt_fallback"),
        "{strict:?}"
    );
    let strict = row(&strict, "slurm.pam_adopt");
    assert_eq!(strict["severity"], "ok", "{strict}");
    assert!(
        strict["message"]
            .as_str()
            .unwrap()
            .contains("join the job's isolation through pam_tenancy.so or tenancyctl adopt"),
        "{strict}"
    );
    // `tenancyctl --config PATH adopt` is the same hook; without --config, adopt reads only
    // /etc/slurm/tenancy.toml (never the PAM environment's TENANCY_CONFIG): a warning when that
    // file does not exist, as every adopted session would then be refused.
    for (line, warned) in [
        (
            "session required pam_exec.so /usr/local/bin/tenancyctl --config /etc/t.toml adopt",
            false,
        ),
        (
            "session required pam_exec.so /usr/local/bin/tenancyctl adopt",
            !Path::new(tenancy_config::DEFAULT_PATH).is_file(),
        ),
    ] {
        let rows = doctor_with_session_line(&config, &pam, line);
        let r = row(&rows, "slurm.pam_adopt");
        assert_eq!(r["severity"], "ok", "{line}: {r}");
        let w = rows.iter().find(|r| r["check"] == "slurm.pam_adopt_config");
        assert_eq!(w.is_some(), warned, "{line}: {rows:?}");
        if let Some(w) = w {
            assert_eq!(w["severity"], "warn", "{w}");
            assert!(w["message"].as_str().unwrap().contains("sshd:2"), "{w}");
        }
    }
    // The PAM module does the same (and gives the session the job's environment); optional,
    // it would let a refused session go on; not installed, PAM would fail every login.
    let module = root.join("pam_tenancy.so");
    std::fs::write(&module, "").unwrap();
    let m = module.display();
    for (line, want, says) in [
        (
            format!("session required {m} config=/etc/t.toml"),
            "ok",
            "join the job's",
        ),
        (format!("session requisite {m}"), "ok", "join the job's"),
        (
            format!("session optional {m}"),
            "error",
            "without pam_tenancy.so",
        ),
        (
            "session required /nonexistent/pam_tenancy.so".to_string(),
            "error",
            "pam_tenancy.so, which is not installed (",
        ),
    ] {
        let rows = doctor_with_session_line(&config, &pam, &line);
        let r = row(&rows, "slurm.pam_adopt");
        assert_eq!(r["severity"], want, "{line}: {r}");
        assert!(r["message"].as_str().unwrap().contains(says), "{line}: {r}");
    }
    // Without pam_slurm_adopt, the check passes.
    std::fs::remove_file(pam.join("sshd")).unwrap();
    let (_, again) = doctor(&config, &pam);
    assert_eq!(row(&again, "slurm.pam_adopt")["severity"], "ok");
    // No NVML: reported, not fatal by itself (jobs asking for --mig are refused).
    assert_eq!(row(&rows, "nvml.load")["severity"], "warn");
}

/// The doctor's rows with an sshd PAM service of pam_slurm_adopt and `session` as its session
/// line.
fn doctor_with_session_line(config: &Path, pam: &Path, session: &str) -> Vec<serde_json::Value> {
    std::fs::write(
        pam.join("sshd"),
        format!("account required pam_slurm_adopt.so action_no_jobs=deny\n{session}\n"),
    )
    .unwrap();
    doctor(config, pam).1
}

/// `tenancyctl doctor --format json`: its exit code and rows.
fn doctor(config: &Path, pam: &Path) -> (Option<i32>, Vec<serde_json::Value>) {
    doctor_with(config, pam, &[])
}

/// [`doctor`] with more arguments.
fn doctor_with(
    config: &Path,
    pam: &Path,
    more: &[&std::ffi::OsStr],
) -> (Option<i32>, Vec<serde_json::Value>) {
    let out = Command::new(env!("CARGO_BIN_EXE_tenancyctl"))
        .args(["doctor", "--format", "json", "--pam-dir"])
        .arg(pam)
        .arg("--config")
        .arg(config)
        .args(more)
        .output()
        .unwrap();
    let rows = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), rows)
}

fn row<'a>(rows: &'a [serde_json::Value], check: &str) -> &'a serde_json::Value {
    rows.iter()
        .find(|r| r["check"] == check)
        .unwrap_or_else(|| panic!("no {check} row in {rows:?}"))
}

/// tenancy-prolog and tenancy-epilog hand MIG jobs (the prolog also NSS-module identities) to
/// tenancy-prolog-dynamic beside them: the doctor fails a node whose slurm.conf runs them
/// without it, and passes it once it is there.
#[test]
fn the_doctor_wants_the_dynamic_build_beside_the_prolog_and_epilog_slurm_runs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let config = common::minimal_config(root);
    let bin = root.join("sbin");
    std::fs::create_dir(&bin).unwrap();
    let exe = |name: &str| {
        let p = bin.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    exe("tenancy-epilog");
    exe("tenancy-prolog");
    let slurm_conf = root.join("slurm.conf");
    std::fs::write(
        &slurm_conf,
        format!(
            "ClusterName=t\n#Epilog=/elsewhere/tenancy-epilog\nepilog = {b}/tenancy-epilog\n\
             Prolog={b}/tenancy-prolog\n",
            b = bin.display()
        ),
    )
    .unwrap();
    let run_for = |check: &str| {
        let (_, rows) = doctor_with(
            &config,
            root,
            &["--slurm-conf".as_ref(), slurm_conf.as_os_str()],
        );
        row(&rows, check).clone()
    };
    let run = || run_for("slurm.epilog");
    let dynamic = bin.join("tenancy-prolog-dynamic");
    for check in ["slurm.epilog", "slurm.prolog"] {
        let missing = run_for(check);
        assert_eq!(missing["severity"], "error", "{missing}");
        assert!(
            missing["message"]
                .as_str()
                .unwrap()
                .contains(&dynamic.display().to_string()),
            "{missing}"
        );
        assert!(missing["remedy"].as_str().unwrap().contains("install"));
    }
    exe("tenancy-prolog-dynamic");
    for check in ["slurm.epilog", "slurm.prolog"] {
        let found = run_for(check);
        assert_eq!(found["severity"], "ok", "{found}");
    }
    // A Prolog= naming the dynamic build itself needs nothing beside it.
    std::fs::remove_file(&dynamic).unwrap();
    std::fs::write(
        &slurm_conf,
        format!(
            "Prolog=/elsewhere/tenancy-prolog-dynamic\nEpilog={}/tenancy-epilog\n",
            bin.display()
        ),
    )
    .unwrap();
    assert_eq!(run_for("slurm.prolog")["severity"], "ok");
    assert_eq!(run()["severity"], "error");
    exe("tenancy-prolog-dynamic");
    // Listed with another epilog on one line: found.
    std::fs::write(
        &slurm_conf,
        format!(
            "Epilog=/etc/slurm/site.sh, {}/tenancy-epilog\n",
            bin.display()
        ),
    )
    .unwrap();
    assert_eq!(run()["severity"], "ok");
    // A slurm.conf that names no tenancy-epilog: a warning (a wrapper may still run it).
    std::fs::write(&slurm_conf, "ClusterName=t\nEpilog=/etc/slurm/epilog.sh\n").unwrap();
    assert_eq!(run()["severity"], "warn");
}

/// Intents recorded before the node restarted (a power loss may have taken their journal
/// files) are a warning that names the jobs and `tenancyctl reconcile --apply`; this boot's
/// are fine.
#[test]
fn the_doctor_names_jobs_whose_intents_predate_a_restart() {
    use tenancy_job::intent_log::{boot_id, IntentLog};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let config = common::minimal_config(root);
    let pam = root.join("pam.d");
    std::fs::create_dir(&pam).unwrap();
    let state = root.join("state");
    std::fs::create_dir(&state).unwrap();
    let (_, rows) = doctor(&config, &pam);
    let r = row(&rows, "state.intent_log");
    assert_eq!(r["severity"], "ok", "{r}");
    assert!(r["message"].as_str().unwrap().contains("none yet"), "{r}");

    let mut log = IntentLog::open(&state).unwrap();
    let now = boot_id().unwrap();
    let slot = log.claim(|_| false).unwrap().unwrap();
    log.write(slot, 41, &now, b"{}").unwrap();
    let (_, rows) = doctor(&config, &pam);
    let r = row(&rows, "state.intent_log");
    assert_eq!(r["severity"], "ok", "{r}");
    assert!(r["message"].as_str().unwrap().contains("1 of 64"), "{r}");

    let slot = log.claim(|_| false).unwrap().unwrap();
    log.write(slot, 42, &[0xee; 16], b"{}").unwrap();
    let (_, rows) = doctor(&config, &pam);
    let r = row(&rows, "state.intent_log");
    assert_eq!(r["severity"], "warn", "{r}");
    let msg = r["message"].as_str().unwrap();
    assert!(msg.contains("job(s) 42 ") && !msg.contains("41"), "{r}");
    assert_eq!(r["remedy"], "tenancyctl reconcile --apply");
}
