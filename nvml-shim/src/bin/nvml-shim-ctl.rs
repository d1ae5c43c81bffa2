//! nvml-shim-ctl: inspect and steer the nvml-shim state file (same configuration as the
//! library: NVML_SHIM_FIXTURE, NVML_SHIM_STATE).

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use nvidia_ml::config::{self, Config};
use nvidia_ml::{layout, model, ret, store, State};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "nvml-shim-ctl",
    about = "Inspect and steer the nvml-shim MIG state"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Format {
    Table,
    Csv,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the whole state file (JSON).
    Show,
    /// Print the resolved configuration (fixture, paths, majors).
    Config,
    /// List GPUs, GPU instances and compute instances.
    List {
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Arm a fault in the shared state file (consumed by whichever process hits it first).
    Arm {
        #[command(subcommand)]
        fault: Fault,
    },
    /// Clear all armed faults (lost GPUs stay lost; see restore-gpu).
    Disarm,
    /// Destroy every GPU/compute instance, clear faults, and sync device nodes.
    Reset {
        /// Also forget lost flags and MIG modes (back to the fixture's values).
        #[arg(long)]
        hard: bool,
    },
    /// Set the MIG mode of a GPU (refused with IN_USE while it has GPU instances).
    Mig {
        gpu: u32,
        #[arg(value_parser = ["on", "off"])]
        mode: String,
        /// Only the pending mode changes, as when the GPU needs a reset to apply it
        /// (`nvidia-smi -mig` on a busy GPU); `reset-gpu` applies it.
        #[arg(long)]
        pending: bool,
    },
    /// Reset a GPU: its pending MIG mode becomes current, every instance on it is gone.
    ResetGpu { gpu: u32 },
    /// Confidential-computing mode of a GPU (H100/H200), as after `nvidia_gpu_tools.py
    /// --set-cc-mode=on|off --reset-after-cc-mode-switch`: a GPU in CC mode makes no instance.
    Cc {
        gpu: u32,
        #[arg(value_parser = ["on", "off"])]
        mode: String,
    },
    /// Hold a GPU instance (and with --ci its compute instance) busy, as a CUDA process or a
    /// monitoring agent does: this process opens the instance's capability device nodes and
    /// every destroy of the instance answers NVML_ERROR_IN_USE until it exits. Prints
    /// `holding <pid> <node>...` once it holds them.
    Hold {
        gpu: u32,
        gi: u32,
        #[arg(long)]
        ci: Option<u32>,
        /// Let go after this many milliseconds (default: hold until killed).
        #[arg(long)]
        for_ms: Option<u64>,
        /// The process name others see (`/proc/<pid>/comm`), e.g. dcgm-exporter.
        #[arg(long)]
        name: Option<String>,
    },
    /// Mark a lost GPU as present again.
    RestoreGpu { gpu: u32 },
    /// Write device nodes, mig-minors and proc-devices files named by the fixture.
    Layout,
}

#[derive(Subcommand)]
enum Fault {
    /// Fail the next GPU instance create(s) with an NVML error (name or number).
    GiCreate {
        error: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
    /// Fail the next compute instance create(s) with an NVML error.
    CiCreate {
        error: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
    /// Report NVML_ERROR_IN_USE on the next N destroys (GPU or compute instances).
    DestroyInUse { count: u32 },
    /// Lose a GPU: every call on it returns NVML_ERROR_GPU_IS_LOST.
    LoseGpu { gpu: u32 },
    /// Make every GPU/compute instance create wait this long first (a slow driver; a long
    /// wait is a hung call). 0 turns it off.
    SlowCreate { ms: u64 },
    /// The same for every destroy.
    SlowDestroy { ms: u64 },
}

fn modify(cfg: &Config, f: impl FnOnce(&mut State) -> Result<()>) -> Result<()> {
    store::modify(cfg, |st| (f(st), true), |st| layout::sync_caps(cfg, st))
        .map_err(|e| anyhow!("{e}"))?
}

fn code(s: &str) -> Result<u32> {
    ret::parse(s)
        .map(|r| r.0)
        .ok_or_else(|| anyhow!("unknown NVML error {s:?}: use a name like INSUFFICIENT_RESOURCES, IN_USE, UNKNOWN or a number"))
}

fn gpu_ok(st: &State, gpu: u32) -> Result<()> {
    if gpu as usize >= st.gpus.len() {
        bail!(
            "GPU index {gpu} out of range (this fixture has {} GPUs)",
            st.gpus.len()
        );
    }
    Ok(())
}

struct Row {
    gpu: u32,
    model: String,
    uuid: String,
    mig: String,
    gi: String,
    gi_profile: String,
    gi_placement: String,
    ci: String,
    ci_profile: String,
    mig_uuid: String,
    cap_minors: String,
}

fn rows(st: &State) -> Vec<Row> {
    let mut v = Vec::new();
    for (i, g) in st.gpus.iter().enumerate() {
        let i = i as u32;
        let mig = format!(
            "{}{}{}{}",
            if g.mig_mode { "enabled" } else { "disabled" },
            match (g.mig_mode, g.pending_mig_mode) {
                (true, false) => ",PENDING-DISABLE",
                (false, true) => ",PENDING-ENABLE",
                _ => "",
            },
            if g.cc_mode { ",CC" } else { "" },
            if g.lost { ",LOST" } else { "" }
        );
        let base = |gi: String,
                    gp: String,
                    pl: String,
                    ci: String,
                    cp: String,
                    mu: String,
                    caps: String| Row {
            gpu: i,
            model: g.model.key().into(),
            uuid: g.uuid.clone(),
            mig: mig.clone(),
            gi,
            gi_profile: gp,
            gi_placement: pl,
            ci,
            ci_profile: cp,
            mig_uuid: mu,
            cap_minors: caps,
        };
        if g.gis.is_empty() {
            v.push(base(
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ));
        }
        for gi in &g.gis {
            let gp = g.model.gi_profile_by_id(gi.profile_id);
            let gpn = gp
                .map(|p| format!("{} ({})", p.name, p.id))
                .unwrap_or_else(|| gi.profile_id.to_string());
            let pl = format!("{}:{}", gi.start, gi.size);
            let gim = model::gi_access_minor(i, gi.id);
            if gi.cis.is_empty() {
                v.push(base(
                    gi.id.to_string(),
                    gpn.clone(),
                    pl.clone(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    gim.to_string(),
                ));
            }
            for ci in &gi.cis {
                let cpn = gp
                    .and_then(|p| model::ci_profile(g.model, p, ci.profile_id))
                    .map(|c| format!("{} ({})", c.name.trim_start_matches("MIG "), c.id))
                    .unwrap_or_else(|| ci.profile_id.to_string());
                v.push(base(
                    gi.id.to_string(),
                    gpn.clone(),
                    pl.clone(),
                    ci.id.to_string(),
                    cpn,
                    config::mig_uuid(&g.uuid, gi.id, ci.id),
                    format!("{gim},{}", model::ci_access_minor(i, gi.id, ci.id)),
                ));
            }
        }
    }
    v
}

fn print_list(st: &State, format: Format) {
    let rs = rows(st);
    let header = [
        "gpu",
        "model",
        "uuid",
        "mig",
        "gi",
        "gi_profile",
        "placement",
        "ci",
        "ci_profile",
        "mig_uuid",
        "cap_minors",
    ];
    let cells = |r: &Row| -> Vec<String> {
        vec![
            r.gpu.to_string(),
            r.model.clone(),
            r.uuid.clone(),
            r.mig.clone(),
            r.gi.clone(),
            r.gi_profile.clone(),
            r.gi_placement.clone(),
            r.ci.clone(),
            r.ci_profile.clone(),
            r.mig_uuid.clone(),
            r.cap_minors.clone(),
        ]
    };
    match format {
        Format::Json => {
            let arr: Vec<serde_json::Value> = rs
                .iter()
                .map(|r| {
                    serde_json::Value::Object(
                        header
                            .iter()
                            .zip(cells(r))
                            .map(|(h, c)| (h.to_string(), serde_json::Value::String(c)))
                            .collect(),
                    )
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&arr).unwrap_or_default());
        }
        Format::Csv => {
            println!("{}", header.join(","));
            for r in &rs {
                let c: Vec<String> = cells(r)
                    .into_iter()
                    .map(|x| {
                        if x.contains(',') {
                            format!("\"{x}\"")
                        } else {
                            x
                        }
                    })
                    .collect();
                println!("{}", c.join(","));
            }
        }
        Format::Table => {
            let all: Vec<Vec<String>> =
                std::iter::once(header.iter().map(|h| h.to_uppercase()).collect())
                    .chain(rs.iter().map(cells))
                    .collect();
            let w: Vec<usize> = (0..header.len())
                .map(|i| all.iter().map(|r| r[i].len()).max().unwrap_or(0))
                .collect();
            for r in all {
                let line: Vec<String> = r
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!("{:w$}", c, w = w[i]))
                    .collect();
                println!("{}", line.join("  ").trim_end());
            }
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let cfg = Config::from_env().map_err(|e| anyhow!(e))?;
    match cli.cmd {
        Cmd::Show => {
            let st = store::read(&cfg, |s| s.clone()).map_err(|e| anyhow!("{e}"))?;
            println!("{}", serde_json::to_string_pretty(&st)?);
        }
        Cmd::Config => print_config(&cfg)?,
        Cmd::List { format } => {
            let st = store::read(&cfg, |s| s.clone()).map_err(|e| anyhow!("{e}"))?;
            print_list(&st, format);
        }
        Cmd::Arm { fault } => modify(&cfg, |st| arm(st, &fault))?,
        Cmd::Disarm => modify(&cfg, |st| {
            st.faults = Default::default();
            Ok(())
        })?,
        Cmd::Reset { hard } => modify(&cfg, |st| {
            if hard {
                *st = State::fresh(&cfg.gpus, Default::default());
            } else {
                st.clear_instances();
            }
            Ok(())
        })?,
        Cmd::Mig { gpu, mode, pending } => {
            modify(&cfg, |st| set_mig(st, gpu, mode == "on", pending))?
        }
        Cmd::ResetGpu { gpu } => modify(&cfg, |st| reset_gpu(st, gpu))?,
        Cmd::Cc { gpu, mode } => modify(&cfg, |st| set_cc(st, gpu, mode == "on"))?,
        Cmd::Hold {
            gpu,
            gi,
            ci,
            for_ms,
            name,
        } => hold(&cfg, gpu, gi, ci, for_ms, name.as_deref())?,
        Cmd::RestoreGpu { gpu } => modify(&cfg, |st| {
            gpu_ok(st, gpu)?;
            st.gpus[gpu as usize].lost = false;
            Ok(())
        })?,
        Cmd::Layout => lay_out(&cfg)?,
    }
    Ok(())
}

/// `config`: the resolved configuration as JSON.
fn print_config(cfg: &Config) -> Result<()> {
    let v = serde_json::json!({
        "fixture": cfg.fixture,
        "state": cfg.state_path,
        "dev_dir": cfg.dev_dir,
        "mig_minors": cfg.mig_minors,
        "proc_devices": cfg.proc_devices,
        "uvm_major": cfg.uvm_major,
        "caps_major": cfg.caps_major,
        "driver_version": cfg.driver_version,
        "instance_caps": cfg.instance_caps,
        "dcgm_job_mapping_dir": cfg.dcgm_mapping_dir,
        "gpus": cfg.gpus.iter().map(|g| serde_json::json!({
            "model": g.model.key(), "uuid": g.uuid, "mig_mode": g.mig_mode,
            "mig_mode_pending": g.mig_pending, "lost": g.lost, "cc_mode": g.cc_mode,
            "reset_required": g.reset_required, "profile_names": g.renames,
        })).collect::<Vec<_>>(),
        "host_major_conflicts": layout::host_major_conflicts(cfg),
    });
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

/// `arm FAULT`: the fault waits in the state file for the call it fails.
fn arm(st: &mut State, fault: &Fault) -> Result<()> {
    match fault {
        Fault::GiCreate { error, count } => {
            let c = code(error)?;
            st.faults
                .gi_create
                .extend(std::iter::repeat_n(c, *count as usize));
        }
        Fault::CiCreate { error, count } => {
            let c = code(error)?;
            st.faults
                .ci_create
                .extend(std::iter::repeat_n(c, *count as usize));
        }
        Fault::DestroyInUse { count } => st.faults.destroy_in_use += count,
        Fault::LoseGpu { gpu } => {
            gpu_ok(st, *gpu)?;
            st.gpus[*gpu as usize].lost = true;
        }
        Fault::SlowCreate { ms } => st.faults.create_delay_ms = *ms,
        Fault::SlowDestroy { ms } => st.faults.destroy_delay_ms = *ms,
    }
    Ok(())
}

/// `mig GPU on|off [--pending]`.
fn set_mig(st: &mut State, gpu: u32, on: bool, pending: bool) -> Result<()> {
    gpu_ok(st, gpu)?;
    let g = &mut st.gpus[gpu as usize];
    if pending {
        g.pending_mig_mode = on;
        return Ok(());
    }
    if !on && !g.gis.is_empty() {
        bail!(
            "GPU {gpu} still has {} GPU instance(s): destroy them first (NVML_ERROR_IN_USE)",
            g.gis.len()
        );
    }
    if on && g.cc_mode {
        bail!("GPU {gpu} is in confidential-computing mode: no MIG (NVML_ERROR_NOT_SUPPORTED)");
    }
    g.mig_mode = on;
    g.pending_mig_mode = on;
    Ok(())
}

/// `reset-gpu GPU`: refused for a lost GPU.
fn reset_gpu(st: &mut State, gpu: u32) -> Result<()> {
    gpu_ok(st, gpu)?;
    if st.gpus[gpu as usize].lost {
        bail!("GPU {gpu} is lost: it needs `restore-gpu` (a reboot on a real node)");
    }
    st.reset_gpu(gpu)
        .map_err(|r| anyhow!("reset of GPU {gpu}: {r}"))
}

/// `cc GPU on|off`: H100 and H200 only, and not under GPU instances.
fn set_cc(st: &mut State, gpu: u32, on: bool) -> Result<()> {
    gpu_ok(st, gpu)?;
    let g = &mut st.gpus[gpu as usize];
    if !matches!(
        g.model,
        model::GpuModel::H100_80GB | model::GpuModel::H200_141GB
    ) {
        bail!("a {} has no confidential-computing mode", g.model);
    }
    if on && !g.gis.is_empty() {
        bail!(
            "GPU {gpu} has {} GPU instance(s): a CC mode change resets the GPU; destroy them first",
            g.gis.len()
        );
    }
    g.cc_mode = on;
    Ok(())
}

/// `layout`: the device nodes, mig-minors and proc-devices files the fixture names.
fn lay_out(cfg: &Config) -> Result<()> {
    if cfg.dev_dir.is_none() && cfg.mig_minors.is_none() && cfg.proc_devices.is_none() {
        bail!("the fixture names no dev_dir, mig_minors or proc_devices: nothing to lay out");
    }
    for w in layout::host_major_conflicts(cfg) {
        eprintln!("warning: {w}");
    }
    store::modify(cfg, |st| (layout::layout(cfg, st), true), |_| Ok(()))
        .map_err(|e| anyhow!("{e}"))?
        .map_err(|e| anyhow!("{e}"))
        .context("layout")?;
    Ok(())
}

/// `hold`: opens the capability nodes of GI `gi` (and CI `ci`) of GPU `gpu`, registers this
/// process as their holder, and keeps them open for `for_ms` milliseconds or until killed.
fn hold(
    cfg: &Config,
    gpu: u32,
    gi: u32,
    ci: Option<u32>,
    for_ms: Option<u64>,
    name: Option<&str>,
) -> Result<()> {
    let dev = cfg
        .dev_dir
        .as_ref()
        .ok_or_else(|| anyhow!("the fixture names no dev_dir: no capability nodes to hold"))?;
    if let Some(n) = name {
        // The name `ps`, `fuser` and the product's holder search show.
        std::fs::write("/proc/self/comm", n).context("cannot set the process name")?;
    }
    let mut minors = vec![(None, model::gi_access_minor(gpu, gi))];
    if let Some(c) = ci {
        minors.push((Some(c), model::ci_access_minor(gpu, gi, c)));
    }
    let mut open = Vec::new();
    let mut paths = Vec::new();
    for (_, minor) in &minors {
        let path = dev.join("nvidia-caps").join(format!("nvidia-cap{minor}"));
        // A driver would answer a real open; the stand-in's nodes have none behind them
        // (ENXIO), so the node is held as an O_PATH descriptor: /proc/<pid>/fd shows it as
        // it shows any open file.
        let fd = rustix::fs::open(
            &path,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .with_context(|| {
            format!(
                "cannot open {} (the prolog, nvidia-modprobe or, with instance_caps, the \
                 stand-in makes it)",
                path.display()
            )
        })?;
        open.push(fd);
        paths.push(path.display().to_string());
    }
    let pid = std::process::id();
    modify(cfg, |st| {
        gpu_ok(st, gpu)?;
        for (c, minor) in &minors {
            st.holders.push(nvidia_ml::state::Holder {
                pid,
                gpu,
                gi,
                ci: *c,
                minor: *minor,
            });
        }
        Ok(())
    })?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "holding {pid} {}", paths.join(" "))?;
        out.flush()?;
    }
    match for_ms {
        Some(ms) => std::thread::sleep(std::time::Duration::from_millis(ms)),
        None => loop {
            std::thread::park();
        },
    }
    drop(open);
    modify(cfg, |st| {
        st.holders.retain(|h| h.pid != pid);
        Ok(())
    })
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvml-shim-ctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
