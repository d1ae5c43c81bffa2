//! The demo a new user runs first (demo/run.sh builds and calls it): a local Slurm cluster with
//! slurm-tenancy installed, jobs of two tenants side by side, what each job got, what was
//! refused, `tenancyctl report`, then everything shut down.

use anyhow::{bail, Result};
use std::fs;
use std::process::ExitCode;
use std::time::Duration;
use tenancy_e2e::{artifact, stack, submitted_id, Cluster, TestUser, Users};

const JOB: &str = r#"#!/bin/sh
echo "job $SLURM_JOB_ID of $USER on $(hostname -s)"
echo "  tenant                 = ${TENANCY_TENANT:-<none>}"
echo "  CUDA_VISIBLE_DEVICES   = ${CUDA_VISIBLE_DEVICES:-<none>}"
echo "  NVIDIA_VISIBLE_DEVICES = ${NVIDIA_VISIBLE_DEVICES:-<none>}"
echo "  TMPDIR                 = ${TMPDIR:-<none>}"
echo "  TENANCY_SCRATCH        = ${TENANCY_SCRATCH:-<none>}"
echo "hello" > "$TENANCY_SCRATCH/result.txt" && echo "  wrote $TENANCY_SCRATCH/result.txt"
sleep 3
"#;

fn say(s: &str) {
    println!("\n=== {s}");
}

fn submit(cluster: &Cluster, user: &TestUser, args: &[&str]) -> Result<Option<u64>> {
    let script = cluster.user_dir(user).join("job.sh");
    fs::write(&script, JOB)?;
    let shown = format!("{} $ sbatch {} job.sh", user.name, args.join(" "));
    let mut c = cluster.cmd_as(user, "sbatch");
    c.args(args).arg(&script);
    let o = cluster.run(c)?;
    println!("{shown}");
    print!("{}", String::from_utf8_lossy(&o.stdout));
    for l in String::from_utf8_lossy(&o.stderr).lines() {
        if l.contains("tenancy:") {
            println!("{l}");
        }
    }
    if o.status.success() {
        Ok(Some(submitted_id(&o)?))
    } else {
        Ok(None)
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tenancy-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the demo starts Slurm daemons and creates users: run it as root (sudo demo/run.sh)");
    }
    let mut users = Users::new();
    let t = stack::Tenants::create(&mut users)?;
    let root = tempfile::Builder::new().prefix("tenancy-demo-").tempdir()?;
    say("Starting a local Slurm cluster with slurm-tenancy installed");
    let (cluster, paths) = stack::start(root.path(), &t)?;
    println!("slurm.conf: {}", cluster.conf.display());
    println!("node {} is {}", cluster.node, cluster.node_state()?);

    say("Jobs of two tenants");
    let a = submit(&cluster, &t.acme1, &["--tenant=acme", "--mig=1g.18gb"])?;
    let g = submit(&cluster, &t.globex1, &["--tenant=globex", "--mig=3g.71gb"])?;

    say("Refused at submit time (no job is created)");
    submit(&cluster, &t.acme1, &["--tenant=globex", "--mig=1g.18gb"])?;
    submit(&cluster, &t.outsider, &["--mig=1g.18gb"])?;
    submit(&cluster, &t.acme1, &["--tenant=acme", "--mig=7g.141gb"])?;
    submit(&cluster, &t.both, &["--mig=1g.18gb"])?;

    say("What each job got");
    for (user, id) in [(&t.acme1, a), (&t.globex1, g)] {
        let Some(id) = id else { continue };
        let info = cluster.wait_job_done(id, Duration::from_secs(60))?;
        println!(
            "job {id}: {} (exit {})",
            info["JobState"],
            info.get("ExitCode").map(String::as_str).unwrap_or("?")
        );
        let out = cluster.user_dir(user).join(format!("slurm-{id}.out"));
        print!(
            "{}",
            fs::read_to_string(&out)
                .unwrap_or_else(|e| format!("  (no output {}: {e})\n", out.display()))
        );
        if let Some(reason) = info.get("Reason").filter(|r| r.as_str() != "None") {
            println!("  reason: {reason}");
        }
    }
    println!("node {} is {}", cluster.node, cluster.node_state()?);

    say("tenancyctl report");
    let mut c = cluster.cmd(artifact("tenancyctl")?);
    c.arg("report");
    let o = cluster.run(c)?;
    print!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let mut c = cluster.cmd(artifact("tenancyctl")?);
    c.args(["audit", "verify"]);
    let o = cluster.run(c)?;
    print!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = paths;

    say("Shutting the cluster down");
    drop(cluster);
    drop(users);
    println!("done");
    Ok(())
}
