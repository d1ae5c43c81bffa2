//! The two books on a real cluster: Slurm's accounting (slurmdbd over MariaDB, the MIG
//! profiles as typed GPU GRES in AccountingStorageTRES, read with `sacct`) and the product's
//! audit log, compared job by job with `tenancyctl report --compare-sacct`. Needs root.

use std::time::{Duration, Instant};
use tenancy_e2e::{scenario, submitted_id, Accounting, Env, Options, Stack, TestUser};

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn submit(stack: &Stack, user: &TestUser, args: &[&str], secs: u32) -> u64 {
    let mut c = stack.cluster.cmd_as(user, "sbatch");
    c.args(args)
        .arg("--no-requeue")
        .args(["-o", "/dev/null", "--wrap"])
        .arg(format!("sleep {secs}"));
    let o = stack.cluster.run(c).unwrap();
    assert!(o.status.success(), "sbatch {args:?}: {}", text(&o));
    submitted_id(&o).unwrap()
}

/// `sacct` rows of the cluster's jobs (parsable, with header), once every job in `ids` shows
/// there as ended: slurmctld sends job records to slurmdbd on its own time.
fn sacct_when_ended(stack: &Stack, ids: &[u64]) -> String {
    let t = Instant::now();
    loop {
        let mut c = stack.cluster.cmd("sacct");
        c.env("TZ", "UTC").args([
            "-a",
            "-X",
            "--parsable2",
            "-o",
            "JobIDRaw,Cluster,NodeList,State,Start,End,ElapsedRaw,AllocTRES",
        ]);
        let o = stack.cluster.run(c).unwrap();
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let ended = ids.iter().all(|id| {
            out.lines().any(|l| {
                l.starts_with(&format!("{id}|"))
                    && !l.contains("|RUNNING|")
                    && !l.contains("|PENDING|")
            })
        });
        if o.status.success() && ended {
            return out;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "sacct does not show jobs {ids:?} ended after 60 s: {}",
            text(&o)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn compare(stack: &Stack, tolerance_seconds: u32) -> std::process::Output {
    let o = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .unwrap();
    let today = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let mut c = stack.tenancyctl();
    c.env("TZ", "UTC").args([
        "report",
        "--compare-sacct",
        "--since",
        &today,
        "--until",
        &today,
        "--tolerance-seconds",
        &tolerance_seconds.to_string(),
    ]);
    c.arg(&stack.paths.audit_log);
    stack.cluster.run(c).unwrap()
}

/// Slurm's accounting with the MIG profiles the jobs ask for as typed GPU GRES.
fn accounting() -> Accounting {
    Accounting {
        gpu_types: vec![
            ("1g.18gb".into(), 7),
            ("2g.35gb".into(), 3),
            ("3g.71gb".into(), 2),
        ],
    }
}

scenario!(
    compare_sacct_agrees_on_the_e2e_jobs,
    Options::default().accounting(accounting()),
    |e: &mut Env| compare_sacct_agrees(e)
);

fn compare_sacct_agrees(e: &Env) {
    let (stack, t) = (&e.stack, &e.t);

    // Jobs with a MIG slice ask Slurm for the same profile as typed GPU GRES, so slurmctld
    // accounts what the prolog makes; one job has no slice.
    let a = submit(
        stack,
        &t.acme1,
        &["--tenant=acme", "--mig=1g.18gb", "--gres=gpu:1g.18gb:1"],
        4,
    );
    let g = submit(
        stack,
        &t.globex1,
        &["--tenant=globex", "--mig=3g.71gb", "--gres=gpu:3g.71gb:1"],
        3,
    );
    let n = submit(stack, &t.acme1, &["--tenant=acme"], 1);
    for id in [a, g, n] {
        let info = stack
            .cluster
            .wait_job_done(id, Duration::from_secs(90))
            .unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "job {id}: {info:?}");
        assert_eq!(
            stack.audit_events(id).unwrap(),
            ["job_start", "job_end"],
            "job {id}"
        );
    }
    let sacct = sacct_when_ended(stack, &[a, g, n]);
    eprintln!("sacct:\n{sacct}");
    assert!(
        sacct
            .lines()
            .any(|l| l.starts_with(&format!("{a}|")) && l.contains("gres/gpu:1g.18gb=1")),
        "Slurm did not account job {a}'s MIG slice as typed GRES: {sacct}"
    );

    // The tolerance a site would run with: the prolog and epilog's own seconds.
    let o = compare(stack, 60);
    let out = text(&o);
    eprintln!("tenancyctl report --compare-sacct:\n{out}");
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("3 Slurm job(s), 3 job_start record(s), 2 usage figure(s) compared")
            && out.contains("the books agree"),
        "{out}"
    );

    // A job Slurm bills for one profile while the prolog made another: the books disagree,
    // for that job alone, on both profiles.
    let m = submit(
        stack,
        &t.acme1,
        &["--tenant=acme", "--mig=2g.35gb", "--gres=gpu:1g.18gb:1"],
        20,
    );
    let info = stack
        .cluster
        .wait_job_done(m, Duration::from_secs(150))
        .unwrap();
    assert_eq!(info["JobState"], "COMPLETED", "job {m}: {info:?}");
    sacct_when_ended(stack, &[m]);
    // Slurm's 20 s of 1g.18gb against the audit log's 20 s of 2g.35gb, each beyond 10 s.
    let o = compare(stack, 10);
    let out = text(&o);
    eprintln!("tenancyctl report --compare-sacct (a mismatched job):\n{out}");
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "DISAGREE job {m} on {}: usage_differs: profile 1g.18gb",
            stack.cluster.node
        )) && out.contains(&format!(
            "DISAGREE job {m} on {}: usage_differs: profile 2g.35gb",
            stack.cluster.node
        )),
        "{out}"
    );
    assert_eq!(out.matches("DISAGREE").count(), 2, "{out}");
}
