//! The product on a pure cgroup v2 node, where Slurm's cgroup/v2 plugin owns the jobs' cgroups
//! (`ConstrainDevices=yes`, `ConstrainRAMSpace=yes`): a user-mode-linux kernel booted on the
//! Slurm 24.11 root (tests/src/uml_node.rs), with the SPANK plugin built for 24.11,
//! tenancy-prolog/-epilog, the NVML stand-in and the firewall installed as on a real node.
//! Needs root; skips loudly otherwise. The kernel and root are made when missing (minutes, once;
//! cached in /var/cache/slurm-tenancy); a failure to make them fails the test.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;
use tenancy_e2e::stack::{nvml_fixture, tenancy_toml, StackPaths, Tenants};
use tenancy_e2e::uml_node::{boot, kernel, NodeRun};
use tenancy_e2e::{artifact, require_root, SlurmRoot, Users};

static SERIAL: Mutex<()> = Mutex::new(());

/// The folder of the product's state on the node (its tmpfs).
const T: &str = "/tmp/tenancy";

/// Boots the node with the product installed and runs `scenario` (shell; `as USER CMD...` runs a
/// client as a user, `$P` is the probe, `$J` a folder every user may write, results go to
/// `$RES` as key=value lines).
fn node_with_product(t: &Tenants, scenario: &str) -> NodeRun {
    let root = SlurmRoot::make("24.11").unwrap_or_else(|e| panic!("Slurm 24.11 root: {e:#}"));
    let kernel = kernel().unwrap_or_else(|e| panic!("UML kernel: {e:#}"));
    let paths = StackPaths::under(std::path::Path::new(T));
    let files: Vec<(&str, PathBuf)> = vec![
        ("tenancy-prolog", artifact("tenancy-prolog").unwrap()),
        ("tenancy-epilog", artifact("tenancy-epilog").unwrap()),
        (
            "tenancy-prolog-dynamic",
            artifact("tenancy-prolog-dynamic").unwrap(),
        ),
        ("tenancyctl", artifact("tenancyctl").unwrap()),
        ("tenancy-e2e-probe", artifact("tenancy-e2e-probe").unwrap()),
        ("nvml-shim-ctl", artifact("nvml-shim-ctl").unwrap()),
        ("libnvidia_ml.so", artifact("libnvidia_ml.so").unwrap()),
        (
            "libspank_tenancy.so",
            root.plugin("libspank_tenancy.so").unwrap(),
        ),
    ];
    let setup = format!(
        r#"set -e
T={T}
mkdir -p $T/state $T/audit $T/scratch $T/lib $T/nvml $T/dev $T/bin
chmod 755 $T $T/scratch $T/lib $T/nvml $T/dev
head -c 32 /dev/urandom >$T/audit/anchor.key
chmod 600 $T/audit/anchor.key
cp /tenancy-uml/bin/libnvidia_ml.so $T/lib/libnvidia-ml.so.1
cat >$T/nvml/fixture.toml <<'EOF'
{fixture}
EOF
cat >/tmp/slurm/tenancy.toml <<'EOF'
{config}
EOF
chmod 644 /tmp/slurm/tenancy.toml
echo "required /tenancy-uml/bin/libspank_tenancy.so config=/tmp/slurm/tenancy.toml" >/tmp/slurm/plugstack.conf
NVML_SHIM_FIXTURE=$T/nvml/fixture.toml /tenancy-uml/bin/nvml-shim-ctl layout
/tenancy-uml/bin/tenancyctl --config /tmp/slurm/tenancy.toml firewall apply
"#,
        fixture = nvml_fixture(&paths),
        config = tenancy_toml(&paths, t),
    );
    let scenario = format!(
        r#"export PATH=/usr/sbin:/usr/bin:/sbin:/bin
RES=/tenancy-uml/out/results
P=/tenancy-uml/bin/tenancy-e2e-probe
J=/tmp/slurm/jobs
as() {{ u=$1; shift; runuser -u "$u" -- env SLURM_CONF=$SLURM_CONF "$@"; }}
job_state() {{ scontrol show job "$1" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }}
wait_done() {{
  i=0
  while :; do
    case $(job_state "$1") in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL) return ;;
    esac
    i=$((i + 1)); [ $i -gt 240 ] && return; sleep 0.5
  done
}}
wait_line() {{ i=0; until grep -q "^$2" "$1" 2>/dev/null; do i=$((i + 1)); [ $i -gt 240 ] && return; sleep 0.5; done; }}
{scenario}
"#
    );
    let conf = "Prolog=/tenancy-uml/bin/tenancy-prolog\nEpilog=/tenancy-uml/bin/tenancy-epilog\n\
                PlugStackConfig=/tmp/slurm/plugstack.conf";
    let run = boot(
        &root,
        &kernel,
        &files,
        conf,
        &setup,
        &scenario,
        Duration::from_secs(900),
    )
    .unwrap_or_else(|e| panic!("UML node: {e:#}"));
    eprintln!("UML node up and down in {:.0} s", run.boot_seconds);
    assert_eq!(run.get("setup_rc"), "0", "{}", run.log);
    assert_eq!(run.get("node_state"), "idle", "{}", run.log);
    run
}

/// On the pure v2 node, each task of a job (the batch task and a step's) stays under the
/// product's device program and firewall: globex's tasks get EPERM opening acme's MIG device
/// nodes, which acme's own step opens past the allowlist, and cannot connect to acme's port,
/// which acme's own step reaches.
#[test]
fn pure_cgroup_v2_node_isolates_every_task() {
    if !require_root("pure_cgroup_v2_node_isolates_every_task") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut users = Users::new();
    let t = Tenants::create(&mut users).expect("users");
    let (a_user, g_user) = (&t.acme1.name, &t.globex1.name);
    let run = node_with_product(
        &t,
        &format!(
            r#"R=$J/release; PORT=7777
a=$(as {a_user} sbatch --tenant=acme --mig=1g.18gb -o $J/a.out --wrap "$P env; $P write \$TMPDIR/secret s3cret; $P serve $PORT $R")
a=${{a##* }}
wait_line $J/a.out listening=
g=$(as {g_user} sbatch --tenant=globex --mig=3g.71gb -o $J/g.out --wrap "$P connect 127.0.0.1:$PORT 2000; $P envwait $R")
g=${{g##* }}
wait_line $J/g.out uid=
echo "a_job=$a" >>$RES; echo "g_job=$g" >>$RES
echo "batch_attack_connect=$(sed -n 's/^connect=//p' $J/g.out | head -1)" >>$RES
step() {{ u=$1; j=$2; shift 2; as "$u" srun --jobid=$j --overlap -n1 -N1 $P "$@"; }}
echo "own_connect=$(step {a_user} $a connect 127.0.0.1:$PORT 2000 | sed -n 's/^connect=//p')" >>$RES
echo "step_attack_connect=$(step {g_user} $g connect 127.0.0.1:$PORT 2000 | sed -n 's/^connect=//p')" >>$RES
for c in {T}/dev/nvidia-caps/*; do
  own=$(step {a_user} $a open $c | sed -n 's/^open=//p')
  other=$(step {g_user} $g open $c | sed -n 's/^open=//p')
  echo "cap_$(basename $c)=$own/$other" >>$RES
done
grep '^cgroup=' $J/a.out | head -3 | sed 's/^/a_batch_/' >>$RES
# Which instance each cap minor is (the stand-in's mig-minors), and the jobs' slices.
sed 's/^\([^ ]*\) \(.*\)/minor_\2=\1/' {T}/nvml/mig-minors >>$RES
grep -h '^CUDA_VISIBLE_DEVICES=' $J/a.out | sed 's/^/a_/' >>$RES
grep -h '^CUDA_VISIBLE_DEVICES=' $J/g.out | sed 's/^/g_/' >>$RES
# Scratch: acme's private folder, read by acme's own step and attacked by globex's.
A_TMP=$(sed -n 's/^TMPDIR=//p' $J/a.out | head -1)
echo "own_scratch=$(step {a_user} $a read $A_TMP/secret | sed -n 's/^read=//p')" >>$RES
echo "scratch_attack=$(step {g_user} $g read $A_TMP/secret | sed -n 's/^read=//p')" >>$RES
# A task epilog (run by slurmstepd after the task, outside the task hook) attacks too.
cat >$J/attack.sh <<ATTACK
#!/bin/sh
{{
  $P connect 127.0.0.1:$PORT 2000
  for c in {T}/dev/nvidia-caps/*; do echo "cap \$(basename \$c) \$($P open \$c)"; done
  cat /proc/self/cgroup
}} >$J/epi.out 2>&1
ATTACK
chmod 755 $J/attack.sh
as {g_user} srun --jobid=$g --overlap -n1 -N1 --task-epilog=$J/attack.sh true
wait_line $J/epi.out 0::
echo "epilog_connect=$(sed -n 's/^connect=//p' $J/epi.out)" >>$RES
grep '^cap ' $J/epi.out | while read _ n v; do echo "epi_$n=${{v#open=}}" >>$RES; done
echo "epilog_cgroup=$(grep '^0::' $J/epi.out)" >>$RES
touch $R
wait_done $a; wait_done $g
echo "a_state=$(job_state $a)" >>$RES
echo "g_state=$(job_state $g)" >>$RES
"#
        ),
    );
    assert_eq!(run.get("a_state"), "COMPLETED", "{}", run.log);
    assert_eq!(run.get("g_state"), "COMPLETED", "{}", run.log);
    let own = run.get("own_connect");
    assert!(own.starts_with("ok"), "acme's own step: {own}\n{}", run.log);
    for k in ["batch_attack_connect", "step_attack_connect"] {
        let r = run.get(k);
        assert!(
            !r.is_empty() && !r.starts_with("ok"),
            "{k}: globex reached acme's port: {r}"
        );
    }
    let caps: Vec<(&String, &String)> = run
        .results
        .iter()
        .filter(|(k, _)| k.starts_with("cap_"))
        .collect();
    assert!(!caps.is_empty(), "no nvidia-caps nodes: {}", run.log);
    // ENXIO: the open passed the device program (no driver behind the node); EPERM: denied
    // by it. EACCES (a root-only node) comes from the file mode, before the device check.
    let mut acme_only = 0;
    for (cap, v) in &caps {
        let (own, other) = v.split_once('/').unwrap_or((v.as_str(), ""));
        if own == "ENXIO" {
            assert_eq!(
                other, "EPERM",
                "{cap}: globex's step opened a node acme's job may open: {:?}",
                run.results
            );
            acme_only += 1;
        }
    }
    assert!(
        acme_only > 0,
        "acme's step opened none of its caps: {caps:?}"
    );
    // Scratch: acme's own step reads its file, globex's cannot.
    let own = run.get("own_scratch");
    assert!(
        own.starts_with("ok s3cret"),
        "acme's own scratch: {own}\n{}",
        run.log
    );
    assert_eq!(run.get("scratch_attack"), "EACCES", "{}", run.log);
    // A task epilog of globex's, which slurmstepd runs after the task exited: held by the same
    // firewall and device program, in globex's job cgroup.
    let epi = run.get("epilog_connect");
    assert!(
        !epi.is_empty() && !epi.starts_with("ok"),
        "globex's task epilog reached acme's port: {epi}\n{}",
        run.log
    );
    for (cap, v) in &caps {
        let (own, _) = v.split_once('/').unwrap_or((v.as_str(), ""));
        if own == "ENXIO" {
            let name = cap.trim_start_matches("cap_");
            assert_eq!(
                run.get(&format!("epi_{name}")),
                "EPERM",
                "globex's task epilog opened acme's {name}"
            );
        }
    }
    let g_job = run.get("g_job");
    let epi_cg = run.get("epilog_cgroup");
    assert!(
        epi_cg.contains(&format!("slurmstepd.scope/job_{g_job}/")),
        "globex's task epilog ran outside its job cgroup: {epi_cg}"
    );
    // The isolation is anchored in Slurm's own job cgroup: the batch task stays where Slurm's
    // cgroup/v2 plugin put it (its memory and CPU limits), never in the product's tree.
    let batch = run.get("a_batch_cgroup");
    let a_job = run.get("a_job");
    assert!(
        batch.contains(&format!("slurmstepd.scope/job_{a_job}/step_batch/")),
        "acme's batch task is not in Slurm's job cgroup: {batch}\n{}",
        run.log
    );
}

/// On the pure v2 node with the product installed, Slurm's own memory limit still applies to a
/// job's tasks: a batch job with `--mem=64` allocating 200 MB (tail holding a line of zeros) is
/// killed by the kernel (as without the product), while the same allocation under `--mem=480`
/// completes; both tasks stay in Slurm's job cgroup.
#[test]
fn pure_cgroup_v2_node_keeps_slurms_memory_limit() {
    if !require_root("pure_cgroup_v2_node_keeps_slurms_memory_limit") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut users = Users::new();
    let t = Tenants::create(&mut users).expect("users");
    let a_user = &t.acme1.name;
    let run = node_with_product(
        &t,
        &format!(
            r#"hog='cat /proc/self/cgroup; head -c 200000000 /dev/zero | tail >/dev/null && echo survived=yes'
for mem in 64 480; do
  j=$(as {a_user} sbatch --tenant=acme --mem=$mem -o $J/mem$mem.out --wrap "$hog")
  j=${{j##* }}
  wait_done $j
  echo "state_$mem=$(job_state $j)" >>$RES
  echo "survived_$mem=$(grep -c '^survived=yes' $J/mem$mem.out)" >>$RES
  echo "cgroup_$mem=$(grep '^0::' $J/mem$mem.out)" >>$RES
done
"#
        ),
    );
    assert_eq!(run.get("survived_480"), "1", "control job: {}", run.log);
    assert_eq!(run.get("state_480"), "COMPLETED", "{}", run.log);
    let cgroup = run.get("cgroup_64");
    assert_eq!(
        run.get("survived_64"),
        "0",
        "a task with --mem=64 allocated 200 MB: Slurm's memory limit did not apply (its cgroup: \
         {cgroup})"
    );
    assert_eq!(run.get("state_64"), "OUT_OF_MEMORY", "{}", run.log);
    assert!(
        cgroup.contains("slurmstepd.scope/job_") && !cgroup.contains("/tenancy/"),
        "the task left Slurm's job cgroup: {cgroup}"
    );
}
