//! Not a check: `sbatch --wrap true` and `srun true` on one real local Slurm cluster (the
//! product's stack) with two builds of the SPANK plugin, timed by hyperfine in the same run
//! (BENCHMARKS.md, "Plugins in Slurm's processes"). Ignored; run as root with
//!
//! ```text
//! SPANK_A=/path/old/libspank_tenancy.so SPANK_B=/path/new/libspank_tenancy.so \
//!   cargo test -p tenancy-e2e --test plugin_bench -- --ignored --nocapture
//! ```
//!
//! (`BENCH_RUNS`, default 30, runs per command and plugin, in each of two orders.) Before each
//! timed run hyperfine's `--prepare` renames the plugin's copy over the one plugstack.conf
//! names: each `sbatch`, `srun` and the slurmstepd of each step loads the build under test;
//! slurmd and the job_submit plugin keep the stack's own build.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tenancy_e2e::{scenario, Env, Options, Stack};

fn wait_queue_empty(stack: &Stack) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(300) {
        let mut c = stack.cluster.cmd("squeue");
        c.args(["-h", "-o", "%i"]);
        let o = stack.cluster.run(c).unwrap();
        if String::from_utf8_lossy(&o.stdout).trim().is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("the queue did not drain");
}

#[test]
#[ignore]
fn sbatch_and_srun_with_two_spank_plugins() {
    let (Some(a), Some(b)) = (std::env::var_os("SPANK_A"), std::env::var_os("SPANK_B")) else {
        eprintln!("SKIP: set SPANK_A and SPANK_B to the two libspank_tenancy.so builds");
        return;
    };
    let runs: u32 = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(30);
    scenario(
        "sbatch_and_srun_with_two_spank_plugins",
        Options::default(),
        |e: &mut Env| bench(e, &a, &b, runs),
    );
}

fn bench(e: &mut Env, a: &std::ffi::OsStr, b: &std::ffi::OsStr, runs: u32) {
    let (stack, t) = (&mut e.stack, &e.t);
    let live = stack.cluster.path("lib/libspank_tenancy.so");
    let lib = live.parent().unwrap().to_path_buf();
    for (name, from) in [("a", a), ("b", b)] {
        let to = lib.join(format!("spank-{name}.so"));
        fs::copy(from, &to).unwrap();
        fs::set_permissions(&to, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let user = &t.acme1;
    let dir = stack.cluster.user_dir(user);
    let groups: Vec<String> = user.gids.iter().map(u32::to_string).collect();
    let as_user = |client: &str| {
        format!(
            "setpriv --reuid={} --regid={} --groups={} -- env -i --chdir={dir} \
             PATH=/usr/local/bin:/usr/bin:/bin SLURM_CONF={} HOME={dir} USER={name} {client}",
            user.uid,
            user.gid,
            groups.join(","),
            stack.cluster.path("etc/slurm.conf").display(),
            dir = dir.display(),
            name = user.name,
        )
    };
    let swap = lib.join("swap-plugin.sh");
    fs::write(&swap, include_str!("../scripts/bench-swap-plugin.sh")).unwrap();
    let prepare = format!(
        "sh {} {} {} {{so}}",
        swap.display(),
        lib.display(),
        live.display()
    );
    let out = std::env::var_os("BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("tenancy-plugin-bench"));
    fs::create_dir_all(&out).unwrap();
    let hyperfine = |label: &str, client: &str, order: &str, runs: u32| {
        let json = out.join(format!("{label}-{}.json", order.replace(',', "")));
        let md = out.join(format!("{label}-{}.md", order.replace(',', "")));
        let mut c = Command::new("hyperfine");
        c.args(["-N", "--warmup", "3", "--runs", &runs.to_string()])
            .args(["--prepare", &prepare])
            .args(["-L", "so", order])
            .args(["--command-name", &format!("{label} spank-{{so}}")])
            .arg("--export-json")
            .arg(&json)
            .arg("--export-markdown")
            .arg(&md)
            .arg(as_user(client));
        let o = c.output().expect("hyperfine (apt install hyperfine)");
        println!("{}", String::from_utf8_lossy(&o.stdout));
        assert!(
            o.status.success(),
            "hyperfine: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        print!("{}", fs::read_to_string(&md).unwrap());
    };
    println!(
        "# {} runs per command, plugin and order; a = {}, b = {}",
        runs,
        Path::new(&a).display(),
        Path::new(&b).display()
    );
    for order in ["a,b", "b,a"] {
        hyperfine("sbatch", "sbatch --wrap true", order, runs);
        wait_queue_empty(stack);
        hyperfine("srun", "srun -N1 -n1 true", order, runs);
        wait_queue_empty(stack);
    }
    stack.stop().unwrap();
}
