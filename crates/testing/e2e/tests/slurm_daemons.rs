//! What Slurm's own daemons do for a user stays inside that user's tenant (ARCHITECTURE.md,
//! "What Slurm's daemons do for a job"), on a real cluster of this hybrid host with the whole
//! product: slurmstepd's connections for a job are the job's (a user who aims them at another
//! tenant's running job gets nothing there, and the drop counts for the user's tenant), the
//! step's stdio files are opened under the job's device allowlist, a job's abstract UNIX
//! sockets are its own, and the connections Slurm needs reach the owner's srun and sattach
//! wherever they run, with no egress or infrastructure entry. The pure cgroup v2 node's half of
//! these tests is in pure_cgroup_v2.rs, the multi-node one in multi_node.rs. Needs root.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tenancy_e2e::steer::{port_rewrite, without_infrastructure, LoginNs, REWRITE_PORT_ENV};
use tenancy_e2e::{
    free_port, probe_kv, scenario, submitted_id, text, wait_output, Cluster, Env, Options, TestUser,
};

/// Waits until `path` holds a line `found` takes; returns the whole file.
fn wait_output_with(
    path: &Path,
    found: impl Fn(&str) -> bool,
    timeout: Duration,
    what: &str,
) -> String {
    let t = Instant::now();
    loop {
        let s = fs::read_to_string(path).unwrap_or_default();
        if s.lines().any(&found) {
            return s;
        }
        assert!(
            t.elapsed() < timeout,
            "{} has no line {what:?} after {timeout:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Connections acme's collector (probe `collect`) took so far.
fn collected(out: &Path) -> usize {
    fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("from="))
        .count()
}

/// Packets the product's table dropped for `tenant`.
fn drops(tenant: &str) -> u64 {
    tenancy_network::tenant_drops("tenancy", tenant)
        .unwrap()
        .expect("the product's table is loaded")
}

/// acme's job taking every connection to its port (probe `collect`) beside a globex job, both
/// running until `release` exists.
struct Target {
    a: u64,
    a_out: std::path::PathBuf,
    g: u64,
    port: u16,
    release: std::path::PathBuf,
}

fn collector_beside_target(e: &Env, name: &str) -> Target {
    let port = free_port().unwrap();
    let release = e.stack.cluster.path(&format!("jobs/release-{name}"));
    let r = release.display();
    let collect = format!("collect {port} {r}");
    let a_job = e.probe_job(&e.t.acme1, &format!("{name}-collect"), &[&collect]);
    let a = e.sbatch(&e.t.acme1, &["--tenant=acme"], &a_job);
    let wait = format!("envwait {r}");
    let g_job = e.probe_job(&e.t.globex1, &format!("{name}-target"), &[&wait]);
    let g = e.sbatch(&e.t.globex1, &["--tenant=globex"], &g_job);
    wait_output(&a_job.out, "listening=", Duration::from_secs(60));
    wait_output(&g_job.out, "uid=", Duration::from_secs(60));
    Target {
        a,
        a_out: a_job.out,
        g,
        port,
        release,
    }
}

/// A Slurm client as `user` with the port rewrite loaded: every port it reports is `port`.
fn steered(cluster: &Cluster, user: &TestUser, program: &str, port: u16) -> Command {
    let so = port_rewrite(&cluster.user_dir(user), user).unwrap();
    let mut c = cluster.cmd_as(user, "timeout");
    c.arg("30")
        .arg(program)
        .env("LD_PRELOAD", so)
        .env(REWRITE_PORT_ENV, port.to_string())
        .stdin(Stdio::null());
    c
}

/// Waits until slurmd's log (slurmstepd logs there too) has a line with every one of
/// `needles`: what a step's slurmstepd logs when it has given up on a connection, or ended.
fn wait_log(cluster: &Cluster, needles: &[&str]) {
    let log = cluster.path("log/slurmd.log");
    let what = needles.join(" … ");
    wait_output_with(
        &log,
        |l| needles.iter().all(|n| l.contains(n)),
        Duration::from_secs(120),
        &what,
    );
}

/// The id of the first step of `job` besides its batch and extern steps, once its
/// slurmstepd runs on the node (slurmd knows it: `scontrol listpids` lists its task).
fn running_step(cluster: &Cluster, job: u64) -> String {
    let t = Instant::now();
    loop {
        let mut c = cluster.cmd("squeue");
        c.args(["-h", "-s", "-j", &job.to_string(), "-o", "%i"]);
        let o = cluster.run(c).unwrap();
        let step = text(&o.stdout).lines().map(str::trim).find_map(|s| {
            let n = s.strip_prefix(&format!("{job}."))?.parse::<u32>().ok()?;
            Some((s.to_string(), n))
        });
        if let Some((id, n)) = step {
            let mut c = cluster.cmd("scontrol");
            c.args(["listpids", &id]);
            let o = cluster.run(c).unwrap();
            let listed = text(&o.stdout).lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() >= 3 && f[1] == job.to_string() && f[2] == n.to_string()
            });
            if listed {
                return id;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(60), "job {job}: no step");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Makes `release` and waits for `jobs` to end (whatever their state).
fn end(e: &Env, release: &Path, jobs: &[u64]) {
    fs::write(release, "").unwrap();
    for j in jobs {
        e.stack
            .cluster
            .wait_job_done(*j, Duration::from_secs(60))
            .unwrap();
    }
}

// globex's user runs a step of their own job with srun reporting acme's port as its own (the
// LD_PRELOAD port rewrite): slurmstepd, told to connect its I/O and launch response there,
// reaches nothing of acme's job, and the drop is globex's. The same steering by acme's user
// into acme's own job reaches the port (the rewrite works).
scenario!(
    srun_io_port_cannot_reach_another_tenant,
    Options::default(),
    |e: &mut Env| {
        let c = &e.stack.cluster;
        let t = collector_beside_target(e, "io");
        let (before, acme_before) = (drops("globex"), drops("acme"));
        let mut srun = steered(c, &e.t.globex1, "srun", t.port);
        srun.arg(format!("--jobid={}", t.g)).args([
            "--overlap",
            "-n1",
            "-N1",
            "echo",
            "globex-secret",
        ]);
        let o: Output = c.run(srun).unwrap();
        // Everything the step's slurmstepd tried (its I/O connection, the launch response with
        // its retries) is over once it is done ("done with job", "done with step" from 24.11).
        wait_log(c, &[&format!("[{}.0]", t.g), "done with "]);
        let report = fs::read_to_string(&t.a_out).unwrap_or_default();
        assert_eq!(
            collected(&t.a_out),
            0,
            "slurmstepd of globex's step reached acme's port {}: {report}\nsrun: {}",
            t.port,
            text(&o.stderr)
        );
        let after = drops("globex");
        assert!(
            after > before,
            "globex's drop counter did not move ({before} -> {after}): the relay was not judged \
             as globex's"
        );
        assert_eq!(
            drops("acme"),
            acme_before,
            "acme's drop counter moved: part of the relay was charged to the tenant it was aimed \
             at"
        );
        // Control: the same steering into acme's own job is acme's flow, and gets there.
        let mut srun = steered(c, &e.t.acme1, "srun", t.port);
        srun.arg(format!("--jobid={}", t.a))
            .args(["--overlap", "-n1", "-N1", "echo", "acme-own"]);
        let _ = c.run(srun).unwrap();
        wait_output(&t.a_out, "from=", Duration::from_secs(60));
        end(e, &t.release, &[t.a, t.g]);
    }
);

// globex's user attaches to a running step of their own job with sattach reporting acme's
// port: slurmstepd's attach connection (`_handle_attach` → `io_client_connect`, as root)
// reaches nothing of acme's job, and the drop is globex's. acme's own sattach steered the
// same way reaches acme's port.
scenario!(
    sattach_cannot_aim_slurmstepd_at_another_tenant,
    Options::default(),
    |e: &mut Env| {
        let c = &e.stack.cluster;
        let t = collector_beside_target(e, "attach");
        let p = e.probe();
        let step_of = |user: &TestUser, job: u64| {
            let mut s = c.cmd_as(user, "srun");
            s.arg(format!("--jobid={job}"))
                .args(["--overlap", "-n1", "-N1"])
                .arg(&p)
                .args(["wait", &t.release.display().to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = s.spawn().unwrap();
            (child, running_step(c, job))
        };
        let (mut g_step, g_id) = step_of(&e.t.globex1, t.g);
        let (before, acme_before) = (drops("globex"), drops("acme"));
        let mut sattach = steered(c, &e.t.globex1, "sattach", t.port);
        sattach.arg(&g_id);
        let o = c.run(sattach).unwrap();
        // slurmstepd's attach (`io_client_connect`) has given up: "connect io" in its log.
        wait_log(c, &[&format!("[{g_id}]"), "error: connect io"]);
        let report = fs::read_to_string(&t.a_out).unwrap_or_default();
        assert_eq!(
            collected(&t.a_out),
            0,
            "slurmstepd of globex's step {g_id} attached to acme's port {}: {report}\nsattach: {}",
            t.port,
            text(&o.stderr)
        );
        let after = drops("globex");
        assert!(
            after > before,
            "globex's drop counter did not move ({before} -> {after})"
        );
        assert_eq!(
            drops("acme"),
            acme_before,
            "acme's drop counter moved: the attach was charged to the tenant it was aimed at"
        );
        // Control: acme's own sattach, steered into acme's own job.
        let (mut a_step, a_id) = step_of(&e.t.acme1, t.a);
        let mut sattach = steered(c, &e.t.acme1, "sattach", t.port);
        sattach.arg(&a_id);
        let _ = c.run(sattach).unwrap();
        wait_output(&t.a_out, "from=", Duration::from_secs(30));
        end(e, &t.release, &[t.a, t.g]);
        for s in [&mut g_step, &mut a_step] {
            let _ = s.wait();
        }
    }
);

/// Runs `cmd` with `input` on its stdin; its output.
fn with_input(mut cmd: Command, input: &str) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

// The owner's srun (stdin in, stdout out) and sattach (into a running step: its stdin reaches
// the task, the task's output comes back) work from the node's shell and from a login host
// beside the node, with no infrastructure entry in the config and no egress entry for either:
// slurmstepd's connections back to them are its own, not the job's code's.
scenario!(
    srun_and_sattach_from_outside_the_job_still_work,
    Options::default().config(without_infrastructure),
    |e: &mut Env| {
        let c = &e.stack.cluster;
        let release = c.path("jobs/release-outside");
        let wait = format!("envwait {}", release.display());
        let a_job = e.probe_job(&e.t.acme1, "outside", &[&wait]);
        let a = e.sbatch(&e.t.acme1, &["--tenant=acme"], &a_job);
        wait_output(&a_job.out, "uid=", Duration::from_secs(60));
        let login = LoginNs::new(c).unwrap();
        let user = &e.t.acme1;
        let client = |at: &str, program: &str| match at {
            "node" => c.cmd_as(user, program),
            _ => login.cmd_as(c, user, program),
        };
        for at in ["node", "login"] {
            // srun: stdin to the task, its stdout back.
            let mut srun = client(at, "timeout");
            srun.arg("60")
                .arg("srun")
                .arg(format!("--jobid={a}"))
                .args(["--overlap", "-n1", "-N1", "cat"]);
            let o = with_input(srun, &format!("hello from the {at}\n"));
            assert_eq!(
                text(&o.stdout).trim(),
                format!("hello from the {at}"),
                "srun from the {at}: {}",
                text(&o.stderr)
            );
            // sattach into a step the node's shell started (cat, its stdin held open here).
            let mut held = c.cmd_as(user, "srun");
            held.arg(format!("--jobid={a}"))
                .args(["--overlap", "-n1", "-N1", "cat"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let mut held = held.spawn().unwrap();
            let step = running_step(c, a);
            let mut sattach = client(at, "timeout");
            sattach
                .arg("60")
                .arg("sattach")
                .arg(&step)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut sattach = sattach.spawn().unwrap();
            let mut sin = sattach.stdin.take().unwrap();
            let line = format!("attached from the {at}");
            // The attach may take a moment: say it again until the echo comes back.
            let (tx, rx) = std::sync::mpsc::channel();
            let sout = sattach.stdout.take().unwrap();
            std::thread::spawn(move || {
                for l in BufReader::new(sout).lines().map_while(Result::ok) {
                    let _ = tx.send(l);
                }
            });
            let t = Instant::now();
            let mut seen = Vec::new();
            while !seen.iter().any(|l: &String| l.contains(&line)) {
                assert!(
                    t.elapsed() < Duration::from_secs(40),
                    "sattach {step} from the {at}: no echo of its input; saw {seen:?}"
                );
                let _ = writeln!(sin, "{line}");
                if let Ok(l) = rx.recv_timeout(Duration::from_secs(2)) {
                    seen.push(l);
                }
            }
            drop(sin);
            drop(held.stdin.take());
            let _ = held.wait();
            let _ = sattach.kill();
            let _ = sattach.wait();
        }
        drop(login);
        end(e, &release, &[a]);
    }
);

// `srun` and `sbatch` `--input`, `--output` and `--error` naming acme's device nodes (its MIG
// capability node for input: a read-only node; the GPU node of its slice for output and error),
// from globex's user: slurmstepd opens the file as globex's user inside globex's job, where
// the device allowlist refuses it (EPERM); acme's own step gets past its allowlist to the
// same node (ENXIO: no driver behind the stand-in's nodes). No such open drains the node.
scenario!(
    stdin_of_another_tenants_device_is_refused,
    Options::default(),
    |e: &mut Env| {
        let c = &e.stack.cluster;
        let release = c.path("jobs/release-stdio");
        let release_g = c.path("jobs/release-stdio-g");
        let (wait_a, wait_g) = (
            format!("envwait {}", release.display()),
            format!("envwait {}", release_g.display()),
        );
        let a_job = e.probe_job(&e.t.acme1, "stdio-a", &[&wait_a]);
        let a = e.sbatch(&e.t.acme1, &["--tenant=acme", "--mig=1g.18gb"], &a_job);
        let g_job = e.probe_job(&e.t.globex1, "stdio-g", &[&wait_g]);
        let g = e.sbatch(&e.t.globex1, &["--tenant=globex"], &g_job);
        let a_text = wait_output(&a_job.out, "uid=", Duration::from_secs(60));
        wait_output(&g_job.out, "uid=", Duration::from_secs(60));
        let uuid = probe_kv(&a_text)["CUDA_VISIBLE_DEVICES"].clone();
        let rows = e.stack.shim_instances().unwrap();
        let row = rows
            .iter()
            .find(|r| r["mig_uuid"].as_str() == Some(uuid.as_str()))
            .unwrap_or_else(|| panic!("acme's slice {uuid} is not in the stand-in's list"));
        let minor = row["cap_minors"]
            .as_str()
            .unwrap()
            .split(',')
            .next()
            .unwrap();
        let dev = |name: String| e.stack.paths.dev_dir.join(name).display().to_string();
        let cap = dev(format!("nvidia-caps/nvidia-cap{minor}"));
        let gpu = dev(format!("nvidia{}", row["gpu"].as_str().unwrap()));
        let streams = [
            ("input", "stdin", &cap),
            ("output", "stdout", &gpu),
            ("error", "stderr", &gpu),
        ];
        // srun opens a plain file name itself, as the user, outside the job (launch.c
        // `_is_local_file`); a name with %u, %t, %n or %N is slurmstepd's to open on the node.
        // So each user names the node through a link in their own folder: `<jobs>/%u/<link>`.
        for user in [&e.t.acme1, &e.t.globex1] {
            for (opt, _, node) in &streams {
                let link = c.user_dir(user).join(format!("{opt}-link"));
                std::os::unix::fs::symlink(node, &link).unwrap();
            }
        }
        let link = |user: &TestUser, opt: &str| {
            c.user_dir(user)
                .join(format!("{opt}-link"))
                .display()
                .to_string()
        };
        let log = c.path("log/slurmd.log");
        let log_len = || fs::metadata(&log).map(|m| m.len() as usize).unwrap_or(0);
        // The error slurmstepd's open of `path` for `stream` got (io.c `_init_task_stdio_fds`),
        // from slurmd's log after byte `from`.
        let open_error = |stream: &str, path: &str, from: usize| -> String {
            let want = format!("Could not open {stream} file {path}: ");
            let t = Instant::now();
            loop {
                let s = fs::read_to_string(&log).unwrap_or_default();
                if let Some(l) = s[from.min(s.len())..].lines().find(|l| l.contains(&want)) {
                    return l.split(&want).nth(1).unwrap_or_default().trim().to_string();
                }
                assert!(
                    t.elapsed() < Duration::from_secs(30),
                    "slurmd's log has no {want:?} after byte {from}"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        };
        let mut failures = Vec::new();
        let by_user = |opt: &str| c.path(&format!("jobs/%u/{opt}-link")).display().to_string();
        for (opt, stream, _) in &streams {
            for (user, job, want) in [
                (&e.t.acme1, a, "No such device or address"),
                (&e.t.globex1, g, "Operation not permitted"),
            ] {
                let from = log_len();
                let mut srun = c.cmd_as(user, "timeout");
                srun.args(["30", "srun"])
                    .arg(format!("--jobid={job}"))
                    .args(["--overlap", "-n1", "-N1"])
                    .arg(format!("--{opt}={}", by_user(opt)))
                    .arg("/bin/true")
                    .stdin(Stdio::null());
                let _ = c.run(srun).unwrap();
                let got = open_error(stream, &link(user, opt), from);
                if got != want {
                    failures.push(format!("srun --{opt} as {}: {got}, want {want}", user.name));
                }
            }
        }
        // Batch jobs of globex's whose script's stream is acme's node, beside acme's job
        // (globex's first job makes room for them: the node has a CPU for each of two jobs).
        end(e, &release_g, &[g]);
        let nothing = e.job(
            &e.t.globex1,
            "stdio-batch",
            include_str!("../scripts/jobs/nothing.sh"),
            &[],
        );
        for (opt, stream, node) in &streams {
            let from = log_len();
            let o = e.sbatch_raw(
                &e.t.globex1,
                &[
                    "--tenant=globex",
                    &format!("--{opt}={node}"),
                    nothing.script.to_str().unwrap(),
                ],
            );
            assert!(o.status.success(), "sbatch --{opt}: {}", text(&o.stderr));
            let j = submitted_id(&o).unwrap();
            let got = open_error(stream, node, from);
            if got != "Operation not permitted" {
                failures.push(format!("sbatch --{opt} as globex: {got}, want EPERM"));
            }
            c.wait_job_done(j, Duration::from_secs(60)).unwrap();
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        let state = c.node_state().unwrap();
        assert!(
            !state.starts_with("drain"),
            "a user's stdio file drained the node: {state}"
        );
        end(e, &release, &[a]);
    }
);

// acme's batch job listens on an abstract UNIX socket and reaches it itself (same step);
// globex's batch task and a step of globex's job get EPERM connecting to it (Landlock's
// scoping, Linux 6.12+), while a process outside every job still reaches it.
#[test]
fn abstract_unix_socket_of_another_tenant_is_refused() {
    if !tenancy_job::abstract_sockets::kernel_scopes() {
        eprintln!(
            "SKIP: this kernel's Landlock (ABI {:?}) cannot scope abstract UNIX sockets: the gap \
             stays (docs/known-gaps.md; tenancyctl doctor says so)",
            tenancy_job::abstract_sockets::kernel_abi()
        );
        return;
    }
    tenancy_e2e::scenario(
        "abstract_unix_socket_of_another_tenant_is_refused",
        Options::default(),
        |e: &mut Env| {
            let c = &e.stack.cluster;
            let p = e.probe();
            let name = format!("tenancy-e2e-{}-acme", std::process::id());
            let release = c.path("jobs/release-abstract");
            let r = release.display().to_string();
            let a_job = e.job(
                &e.t.acme1,
                "abstract-a",
                include_str!("../scripts/jobs/abstract-socket.sh"),
                &[p.as_str(), name.as_str(), r.as_str()],
            );
            let a = e.sbatch(&e.t.acme1, &["--tenant=acme"], &a_job);
            let a_text = wait_output(&a_job.out, "uid=", Duration::from_secs(60));
            assert!(
                probe_kv(&a_text)["uconnect"].starts_with("ok"),
                "acme's own step could not reach its socket: {a_text}"
            );
            let (connect, wait) = (format!("uconnect {name}"), format!("envwait {r}"));
            let g_job = e.probe_job(&e.t.globex1, "abstract-g", &[&connect, &wait]);
            let g = e.sbatch(&e.t.globex1, &["--tenant=globex"], &g_job);
            let g_text = wait_output(&g_job.out, "uid=", Duration::from_secs(60));
            assert_eq!(
                probe_kv(&g_text)["uconnect"],
                "EPERM",
                "globex's batch task reached acme's abstract socket: {g_text}"
            );
            let o = e.step(&e.t.globex1, g, &["uconnect", &name]);
            assert_eq!(
                probe_kv(&text(&o.stdout))
                    .get("uconnect")
                    .map(String::as_str),
                Some("EPERM"),
                "globex's step reached acme's abstract socket: {} {}",
                text(&o.stdout),
                text(&o.stderr)
            );
            // Outside every job (a root shell on the node): the socket is there.
            let o = Command::new(&p).args(["uconnect", &name]).output().unwrap();
            assert!(
                probe_kv(&text(&o.stdout))["uconnect"].starts_with("ok"),
                "control: {}",
                text(&o.stdout)
            );
            end(e, &release, &[a, g]);
        },
    );
}
