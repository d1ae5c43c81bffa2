//! `tenancyctl check`: validates the config and prints what each tenant and tier enforces.

use crate::output::Format;
use crate::output::Rows;
use serde::Serialize;
use std::process::ExitCode;
use tenancy_config::{group_gid, Config, ScratchOnExit};

#[derive(Serialize)]
struct TenantRow {
    tenant: String,
    tier: String,
    groups: Vec<String>,
    accounts: Vec<String>,
    egress: Vec<String>,
    mig_profiles: Vec<String>,
    share_gpu: bool,
    share_node: bool,
    scratch_on_exit: String,
    /// Groups this host's NSS does not know (members cannot be resolved here).
    unknown_groups: Vec<String>,
}

fn scratch_policy(on_exit: ScratchOnExit, days: u32) -> String {
    match on_exit {
        ScratchOnExit::Wipe => "wipe".into(),
        ScratchOnExit::Retain => format!("retain {days} days"),
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

/// Every MIG profile name the config uses, with where.
pub(crate) fn configured_mig_names(config: &Config) -> Vec<tenancy_mig::Configured> {
    let mut out: Vec<tenancy_mig::Configured> = Vec::new();
    for t in config.tiers.values() {
        for p in &t.mig_profiles {
            out.push(tenancy_mig::Configured {
                name: p.clone(),
                used_in: format!("tier {}", t.name),
            });
        }
    }
    for (model, profiles) in &config.mig_plan {
        for p in profiles.keys() {
            out.push(tenancy_mig::Configured {
                name: p.clone(),
                used_in: format!("mig plan {model}"),
            });
        }
    }
    out
}

/// The configured MIG profile names against what this node's driver reports: (driver version,
/// one message per name it does not report), or why it could not be asked.
pub(crate) fn mig_name_report(config: &Config) -> Result<(String, Vec<String>), String> {
    if let Some(f) = &config.cluster.nvml_shim_fixture {
        // Only the NVML stand-in reads it (tests and demos).
        std::env::set_var("NVML_SHIM_FIXTURE", f);
    }
    let mig = tenancy_mig::Mig::open(config.cluster.nvml_library.as_deref())
        .map_err(|e| e.to_string())?;
    let names = mig.driver_names().map_err(|e| e.to_string())?;
    let driver = mig.driver_version();
    Ok((
        driver.clone(),
        tenancy_mig::names::mismatches(&configured_mig_names(config), &names, &driver),
    ))
}

/// The config, its node pools checked against slurm.conf's nodes when slurm.conf can be read
/// (a warning says so when it cannot and there are pools).
pub fn load(
    explicit: Option<&std::path::Path>,
    slurm_conf: Option<std::path::PathBuf>,
) -> Result<Config, tenancy_config::ConfigError> {
    let path = Config::find(explicit)?;
    let slurm_path = slurm_conf.unwrap_or_else(tenancy_config::slurm_conf::default_path);
    match tenancy_config::slurm_conf::SlurmConf::load(&slurm_path) {
        Ok(slurm) => Config::from_file_for(&path, Some(&slurm)),
        Err(e) => {
            let config = Config::from_file(&path)?;
            if config.has_pools() {
                eprintln!("warning: node pools not checked against slurm.conf's nodes: {e}");
            }
            Ok(config)
        }
    }
}

pub fn run(config: &Config, format: Format) -> anyhow::Result<ExitCode> {
    let rows: Vec<TenantRow> = config
        .tenants
        .values()
        .map(|t| {
            let tier = config.tier_of(t);
            TenantRow {
                tenant: t.name.clone(),
                tier: tier.name.clone(),
                groups: t.groups.clone(),
                accounts: t.accounts.clone(),
                egress: t.egress.iter().map(ToString::to_string).collect(),
                mig_profiles: tier.mig_profiles.clone(),
                share_gpu: tier.share_gpu,
                share_node: tier.share_node,
                scratch_on_exit: match tier.scratch_encryption {
                    tenancy_config::ScratchEncryption::Off => {
                        scratch_policy(tier.scratch_on_exit, tier.retain_days)
                    }
                    tenancy_config::ScratchEncryption::Required => format!(
                        "{}, encrypted",
                        scratch_policy(tier.scratch_on_exit, tier.retain_days)
                    ),
                },
                unknown_groups: t
                    .groups
                    .iter()
                    .filter(|g| group_gid(g).is_none())
                    .cloned()
                    .collect(),
            }
        })
        .collect();
    if format == Format::Table {
        let c = &config.cluster;
        println!(
            "config {}: OK: cluster {}, {} tier(s), {} tenant(s)",
            config.path.display(),
            c.name,
            config.tiers.len(),
            config.tenants.len()
        );
        println!(
            "state_dir {}  audit_log {}  scratch_root {}",
            c.state_dir.display(),
            c.audit_log.display(),
            c.scratch_root.display()
        );
        let infra: Vec<String> = config
            .infrastructure
            .iter()
            .map(ToString::to_string)
            .collect();
        println!(
            "infrastructure (every tenant): {}\n",
            if infra.is_empty() {
                "none".into()
            } else {
                infra.join(", ")
            }
        );
    }
    Rows {
        headers: &[
            "tenant",
            "tier",
            "groups",
            "accounts",
            "mig profiles",
            "share gpu",
            "share node",
            "scratch on exit",
            "egress",
        ],
        rows: &rows,
        cells: |r| {
            vec![
                r.tenant.clone(),
                r.tier.clone(),
                r.groups.join(","),
                r.accounts.join(","),
                r.mig_profiles.join(","),
                yes_no(r.share_gpu),
                yes_no(r.share_node),
                r.scratch_on_exit.clone(),
                r.egress.join(","),
            ]
        },
    }
    .print(format)?;
    // The names the tiers and the plan use, against the driver on this host (when it has one).
    if !configured_mig_names(config).is_empty() {
        let report = mig_name_report(config);
        match (&report, format) {
            (Ok((driver, bad)), Format::Table) if bad.is_empty() => {
                println!("\nMIG profile names: as the driver {driver} on this host reports them");
            }
            (Ok((_, bad)), Format::Table) => {
                println!();
                for m in bad {
                    println!("warning: {m}");
                }
            }
            (Ok((_, bad)), _) => {
                for m in bad {
                    eprintln!("warning: {m}");
                }
            }
            (Err(e), Format::Table) => {
                println!("\nMIG profile names: not checked on this host ({e})");
            }
            (Err(_), _) => {}
        }
    }
    if format == Format::Table {
        for r in rows.iter().filter(|r| !r.unknown_groups.is_empty()) {
            eprintln!(
                "warning: tenant {}: group(s) {} unknown to NSS on this host",
                r.tenant,
                r.unknown_groups.join(", ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
