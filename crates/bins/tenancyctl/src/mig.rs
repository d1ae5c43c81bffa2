//! `tenancyctl mig ...` subcommands.

use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use tenancy_mig::plan::{plan_slots, slurm_lines, NodePlan, PlanGpu};
use tenancy_mig::Mig;

use crate::output::Format;

#[derive(Debug, Args)]
pub struct MigArgs {
    #[command(subcommand)]
    pub cmd: MigCmd,
    /// NVML library to load (default libnvidia-ml.so.1).
    #[arg(long, global = true)]
    pub nvml_library: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Table, global = true)]
    pub format: Format,
    /// The plan of the admin config (`[mig.plan]`), used when `--plan` is not given.
    #[arg(skip)]
    pub config_plan: Option<NodePlan>,
}

#[derive(Debug, Subcommand)]
pub enum MigCmd {
    /// List GPUs and their GPU/compute instances.
    Instances,
    /// Print the plan's slots and the slurm.conf Gres= value and gres.conf lines for a node.
    SlurmLines {
        /// Plan file (JSON or TOML, NodePlan format); default: `[mig.plan]` of the config.
        #[arg(long)]
        plan: Option<PathBuf>,
        /// Node name for the NodeName= of the gres.conf lines.
        #[arg(long)]
        node: String,
        /// Use this GPU list (JSON array of {index, minor, model}) instead of asking NVML.
        #[arg(long)]
        gpus: Option<PathBuf>,
    },
}

fn load_plan(path: &PathBuf) -> anyhow::Result<NodePlan> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("mig: cannot read plan {}: {e}", path.display()))?;
    if path.extension().and_then(|e| e.to_str()) == Some("json") {
        Ok(serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("mig: plan {}: {e}", path.display()))?)
    } else {
        Ok(toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("mig: plan {}: {e}", path.display()))?)
    }
}

pub fn run(args: MigArgs) -> anyhow::Result<ExitCode> {
    match args.cmd {
        MigCmd::Instances => {
            let mig = Mig::open(args.nvml_library.as_deref())?;
            let views = mig.instances()?;
            match args.format {
                Format::Json => println!("{}", serde_json::to_string_pretty(&views)?),
                Format::Csv => {
                    println!("gpu,uuid,model,mig,gi,profile_id,start,size,cis");
                    for v in &views {
                        for g in &v.instances {
                            let cis: Vec<String> = g.ci_ids.iter().map(|c| c.to_string()).collect();
                            println!(
                                "{},{},{},{},{},{},{},{},{}",
                                v.index,
                                v.uuid,
                                v.model.map(|m| m.to_string()).unwrap_or_default(),
                                v.mig_enabled,
                                g.gi_id,
                                g.profile_id,
                                g.start,
                                g.size,
                                cis.join(";")
                            );
                        }
                    }
                }
                Format::Table => {
                    for v in &views {
                        println!(
                            "GPU {} {} {} MIG {}",
                            v.index,
                            v.uuid,
                            v.name,
                            if v.mig_enabled { "on" } else { "off" }
                        );
                        for g in &v.instances {
                            println!(
                                "  GI {:>2}  profile id {:>2}  placement {}:{}  CIs {:?}",
                                g.gi_id, g.profile_id, g.start, g.size, g.ci_ids
                            );
                        }
                    }
                }
            }
        }
        MigCmd::SlurmLines { plan, node, gpus } => {
            let plan = match (plan, args.config_plan) {
                (Some(path), _) => load_plan(&path)?,
                (None, Some(p)) => p,
                (None, None) => {
                    anyhow::bail!("mig: no plan: pass --plan FILE or set [mig.plan] in the config")
                }
            };
            let gpus: Vec<PlanGpu> = match gpus {
                Some(p) => serde_json::from_str(&std::fs::read_to_string(&p)?)?,
                None => Mig::open(args.nvml_library.as_deref())?.plan_gpus(true)?,
            };
            let slots = plan_slots(&plan, &gpus)?;
            let (gres, lines) = slurm_lines(&node, &slots)?;
            match args.format {
                Format::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "slots": slots, "slurm_conf_gres": gres, "gres_conf": lines
                    }))?
                ),
                Format::Csv => {
                    println!("slot,gpu,profile,start,size,compute_slices");
                    for s in &slots {
                        println!(
                            "{},{},{},{},{},{}",
                            s.index, s.gpu, s.profile, s.start, s.size, s.compute_slices
                        );
                    }
                }
                Format::Table => {
                    println!("# slurm.conf, on NodeName={node}: {gres}");
                    println!("# gres.conf:");
                    for l in &lines {
                        println!("{l}");
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
