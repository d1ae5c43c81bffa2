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
        ("port_rewrite.so", port_rewrite_so()),
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

/// The LD_PRELOAD port rewrite (tests/src/port_rewrite.c), built once per run for the node's
/// `/tenancy-uml/bin`.
fn port_rewrite_so() -> PathBuf {
    static SO: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    SO.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let so = tenancy_e2e::steer::port_rewrite_in(d.path()).unwrap();
        (d, so)
    })
    .1
    .clone()
}

/// Shell: `drops TENANT` prints the node's drop counter of the tenant.
const DROPS: &str = r#"drops() { nft list counter inet tenancy "drop_$1" | sed -n 's/.*packets \([0-9]*\).*/\1/p'; }
steered() { u=$1; port=$2; shift 2; as "$u" env LD_PRELOAD=/tenancy-uml/bin/port_rewrite.so TENANCY_REWRITE_PORT=$port timeout 30 "$@" </dev/null; }
# The step's slurmstepd has done all it tries (I/O, the launch response and its retries).
step_done() { i=0; until grep -F "[$1]" /tmp/slurm/slurmd.log | grep -q "done with "; do i=$((i + 1)); [ $i -gt 240 ] && return; sleep 0.5; done; }
"#;

/// The pure v2 node's half of slurm_daemons.rs's test: globex's srun reporting acme's port
/// (the LD_PRELOAD port rewrite) gets slurmstepd to connect there from globex's job folder,
/// which the firewall judges as globex's: acme's job takes no connection, globex's drop counter
/// moves and acme's does not (its listener's answers to a root:root connection of globex's
/// slurmstepd used to be dropped as acme's). acme's own srun steered the same way reaches
/// acme's port.
#[test]
fn srun_io_port_cannot_reach_another_tenant() {
    if !require_root("srun_io_port_cannot_reach_another_tenant (pure cgroup v2 node)") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut users = Users::new();
    let t = Tenants::create(&mut users).expect("users");
    let (a_user, g_user) = (&t.acme1.name, &t.globex1.name);
    let run = node_with_product(
        &t,
        &format!(
            r#"{DROPS}R=$J/release; PORT=7801
a=$(as {a_user} sbatch --tenant=acme -o $J/a.out --wrap "$P collect $PORT $R"); a=${{a##* }}
g=$(as {g_user} sbatch --tenant=globex -o $J/g.out --wrap "$P envwait $R"); g=${{g##* }}
wait_line $J/a.out listening=; wait_line $J/g.out uid=
d0=$(drops globex); a0=$(drops acme)
steered {g_user} $PORT srun --jobid=$g --overlap -n1 -N1 echo globex-secret
step_done $g.0
echo "attack_accepted=$(grep -c '^from=' $J/a.out)" >>$RES
echo "globex_drops=$d0 $(drops globex)" >>$RES
echo "acme_drops=$a0 $(drops acme)" >>$RES
steered {a_user} $PORT srun --jobid=$a --overlap -n1 -N1 echo acme-own
step_done $a.0
echo "control_accepted=$(grep -c '^from=' $J/a.out)" >>$RES
touch $R; wait_done $a; wait_done $g
"#
        ),
    );
    assert_eq!(
        run.get("attack_accepted"),
        "0",
        "slurmstepd of globex's step reached acme's port\n{}",
        run.log
    );
    let drops: Vec<u64> = run
        .get("globex_drops")
        .split(' ')
        .map(|n| n.parse().unwrap_or(0))
        .collect();
    assert!(
        drops.len() == 2 && drops[1] > drops[0],
        "globex's drop counter did not move: {drops:?}\n{}",
        run.log
    );
    let (a0, a1) = run.get("acme_drops").split_once(' ').unwrap_or_default();
    assert_eq!(
        a0, a1,
        "acme's drop counter moved: part of the relay (slurmstepd's root:root launch response) \
         was charged to the tenant it was aimed at\n{}",
        run.log
    );
    assert_ne!(
        run.get("control_accepted"),
        "0",
        "control: acme's own steered step did not reach acme's port (the rewrite did not \
         work)\n{}",
        run.log
    );
}

/// The pure v2 node's half of slurm_daemons.rs's test: with the firewall's infrastructure list
/// emptied and no egress entry, the owner's srun (stdin in, stdout out) and sattach (into a
/// running step) work from the node's shell (the node's name is its own address, not
/// loopback) and from a login host in a network namespace beside the node.
#[test]
fn srun_and_sattach_from_outside_the_job_still_work() {
    if !require_root("srun_and_sattach_from_outside_the_job_still_work (pure cgroup v2 node)") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut users = Users::new();
    let t = Tenants::create(&mut users).expect("users");
    let a_user = &t.acme1.name;
    let run = node_with_product(
        &t,
        &format!(
            r#"R=$J/release
sed -i 's|^infrastructure = .*|infrastructure = []|' /tmp/slurm/tenancy.toml
/tenancy-uml/bin/tenancyctl --config /tmp/slurm/tenancy.toml firewall apply
echo "infrastructure=$(grep -c '^infrastructure = \[\]' /tmp/slurm/tenancy.toml)" >>$RES
# The node's name is its own address for the shell's clients; the login host's, the node's
# end of its veth pair (bind mounts inside the node only).
echo "192.0.2.10 vm" >/tmp/hosts.node; mount --bind /tmp/hosts.node /etc/hosts
ip netns add login
ip link add lv0 type veth peer name lv1 netns login
ip addr add 10.9.0.1/30 dev lv0; ip link set lv0 up
ip -n login addr add 10.9.0.2/30 dev lv1; ip -n login link set lv1 up; ip -n login link set lo up
echo "10.9.0.1 vm" >/tmp/hosts.login
node() {{ "$@"; }}
login() {{ ip netns exec login unshare -m sh -c 'mount --bind /tmp/hosts.login /etc/hosts && exec "$@"' login "$@"; }}
a=$(as {a_user} sbatch --tenant=acme -o $J/a.out --wrap "$P envwait $R"); a=${{a##* }}
wait_line $J/a.out uid=
for at in node login; do
  out=$(echo "hello from the $at" | $at runuser -u {a_user} -- env SLURM_CONF=$SLURM_CONF timeout 60 srun --jobid=$a --overlap -n1 -N1 cat 2>$J/srun-$at.err)
  echo "srun_$at=$out" >>$RES
  # A step the node's shell starts, its stdin held open by a fifo; then sattach into it.
  rm -f /tmp/in-$at; mkfifo /tmp/in-$at
  as {a_user} srun --jobid=$a --overlap -n1 -N1 cat </tmp/in-$at >/dev/null 2>&1 &
  exec 3>/tmp/in-$at
  i=0; s=
  while [ -z "$s" ] && [ $i -lt 120 ]; do
    s=$(squeue -h -s -j $a -o %i | grep -v 'batch\|extern' | tail -1)
    [ -n "$s" ] && ! scontrol listpids "$s" 2>/dev/null | grep -q " ${{s#*.}} " && s=
    i=$((i + 1)); sleep 0.5
  done
  ( for k in 1 2 3 4 5 6; do sleep 2; echo "attached from the $at"; done ) |
    $at runuser -u {a_user} -- env SLURM_CONF=$SLURM_CONF timeout 20 sattach "$s" >$J/sattach-$at.out 2>$J/sattach-$at.err
  echo "sattach_$at=$(grep -c "attached from the $at" $J/sattach-$at.out)" >>$RES
  exec 3>&-
  wait
done
touch $R; wait_done $a
echo "a_state=$(job_state $a)" >>$RES
"#
        ),
    );
    assert_eq!(run.get("infrastructure"), "1", "{}", run.log);
    for at in ["node", "login"] {
        assert_eq!(
            run.get(&format!("srun_{at}")),
            format!("hello from the {at}"),
            "srun from the {at}\n{}",
            run.log
        );
        assert_ne!(
            run.get(&format!("sattach_{at}")),
            "0",
            "sattach from the {at} got no echo of its input\n{}",
            run.log
        );
    }
    assert_eq!(run.get("a_state"), "COMPLETED", "{}", run.log);
}
