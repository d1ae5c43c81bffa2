//! `tenancyctl firewall show|apply`: clap arguments and run functions. main.rs
//! builds the [`FirewallSpec`] from the admin config and dispatches here.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;

use tenancy_network::{apply, counters, ruleset, FirewallSpec};

use crate::output::Format;

/// `tenancyctl firewall show`: per tenant its cgroup, egress and drop counters.
#[derive(Args, Debug, Clone, Default)]
pub struct ShowArgs {
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Print the nft script that `firewall apply` would load instead of the summary.
    #[arg(long)]
    pub rules: bool,
}

/// `tenancyctl firewall apply`: create tenant cgroups and replace the table atomically.
#[derive(Args, Debug, Clone, Default)]
pub struct ApplyArgs {
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Print the script and load nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Serialize)]
struct Row {
    tenant: String,
    id: u32,
    cgroup: String,
    egress: String,
    drop_packets: Option<u64>,
    drop_bytes: Option<u64>,
    /// Across nodes: the tenant's address on this node (JSON only).
    #[serde(skip_serializing_if = "Option::is_none")]
    address: Option<String>,
}

fn rows(spec: &FirewallSpec, with_counters: bool) -> anyhow::Result<Vec<Row>> {
    let cnt = if with_counters {
        Some(counters(spec)?)
    } else {
        None
    };
    Ok(spec
        .tenants
        .iter()
        .map(|t| {
            let c = cnt
                .as_ref()
                .and_then(|v| v.iter().find(|c| c.tenant == t.name));
            Row {
                tenant: t.name.clone(),
                id: t.id,
                cgroup: format!(
                    "level {} \"{}\"",
                    spec.cgroup.tenant_level(),
                    spec.cgroup.nft_tenant_path(&t.name)
                ),
                egress: t
                    .egress
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                drop_packets: c.map(|c| c.packets),
                drop_bytes: c.map(|c| c.bytes),
                address: spec
                    .cross_node
                    .as_ref()
                    .and_then(|x| x.address(&t.name))
                    .map(|a| a.to_string()),
            }
        })
        .collect())
}

fn opt(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn print_rows(
    out: &mut dyn Write,
    spec: &FirewallSpec,
    rows: &[Row],
    format: Format,
) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            let v = serde_json::json!({
                "table": spec.table_name,
                "infrastructure": spec.infrastructure.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
                "tenants": rows,
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        }
        Format::Csv => {
            writeln!(out, "tenant,id,cgroup,egress,drop_packets,drop_bytes")?;
            for r in rows {
                writeln!(
                    out,
                    "{},{},{},{},{},{}",
                    csv_field(&r.tenant),
                    r.id,
                    csv_field(&r.cgroup),
                    csv_field(&r.egress),
                    opt(r.drop_packets),
                    opt(r.drop_bytes)
                )?;
            }
        }
        Format::Table => {
            writeln!(
                out,
                "table inet {}; infrastructure: {}",
                spec.table_name,
                spec.infrastructure
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            )?;
            let w_t = rows
                .iter()
                .map(|r| r.tenant.len())
                .max()
                .unwrap_or(0)
                .max(6);
            let w_c = rows
                .iter()
                .map(|r| r.cgroup.len())
                .max()
                .unwrap_or(0)
                .max(6);
            writeln!(
                out,
                "{:<w_t$}  {:>5}  {:<w_c$}  {:>12}  {:>12}  EGRESS",
                "TENANT", "ID", "CGROUP", "DROP_PKTS", "DROP_BYTES"
            )?;
            for r in rows {
                writeln!(
                    out,
                    "{:<w_t$}  {:>5}  {:<w_c$}  {:>12}  {:>12}  {}",
                    r.tenant,
                    r.id,
                    r.cgroup,
                    opt(r.drop_packets),
                    opt(r.drop_bytes),
                    r.egress
                )?;
            }
        }
    }
    Ok(())
}

/// Run `firewall show`, writing to `out`.
pub fn show_to(
    spec: &FirewallSpec,
    args: &ShowArgs,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    if args.rules {
        write!(out, "{}", ruleset(&spec.for_this_node()?)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    // The levels as loaded (a bind-mounted cgroup2 adds its depth); as configured where this
    // node cannot resolve them (the error shows with --rules and apply).
    let spec = &spec.for_this_node().unwrap_or_else(|_| spec.clone());
    let rows = rows(spec, true)?;
    print_rows(out, spec, &rows, args.format)?;
    Ok(ExitCode::SUCCESS)
}

/// Run `firewall show` on stdout.
pub fn run_show(spec: &FirewallSpec, args: &ShowArgs) -> anyhow::Result<ExitCode> {
    show_to(spec, args, &mut std::io::stdout().lock())
}

/// Run `firewall apply`, writing to `out`. With `state_dir` (the node's journals), the
/// running jobs anchored in Slurm's job folders (pure cgroup v2) keep their firewall elements,
/// loaded with the new table in one transaction.
pub fn apply_to(
    spec: &FirewallSpec,
    state_dir: Option<&Path>,
    args: &ApplyArgs,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    if args.dry_run {
        write!(
            out,
            "{}",
            tenancy_network::replace_script(&spec.for_this_node()?)?
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let kept = match state_dir {
        Some(dir) => tenancy_node::layers::network::apply_keeping_jobs(spec, dir)
            .map_err(|e| anyhow::anyhow!("firewall apply: {}", e.0))?,
        None => {
            apply(spec)?;
            Vec::new()
        }
    };
    let spec = &spec.for_this_node()?;
    let rows = rows(spec, false)?;
    print_rows(out, spec, &rows, args.format)?;
    if !kept.is_empty() && args.format == Format::Table {
        let ids: Vec<String> = kept.iter().map(u64::to_string).collect();
        writeln!(
            out,
            "running jobs kept in the jobs maps: {}",
            ids.join(", ")
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Run `firewall apply` on stdout.
pub fn run_apply(
    spec: &FirewallSpec,
    state_dir: &Path,
    args: &ApplyArgs,
) -> anyhow::Result<ExitCode> {
    apply_to(spec, Some(state_dir), args, &mut std::io::stdout().lock())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenancy_network::{CgroupLayout, Dest, TenantNet};

    #[test]
    fn dry_run_and_rules_print_scripts() {
        let spec = FirewallSpec {
            table_name: "tenancy".into(),
            cgroup: CgroupLayout::hybrid("tenancy"),
            tenants: vec![TenantNet {
                name: "acme".into(),
                id: 1,
                egress: vec![Dest::parse("10.1.0.0/16").unwrap()],
            }],
            infrastructure: vec![],
            slurm: None,
            cross_node: None,
        };
        let mut out = Vec::new();
        apply_to(
            &spec,
            None,
            &ApplyArgs {
                format: Format::Table,
                dry_run: true,
            },
            &mut out,
        )
        .unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("table inet tenancy\ndelete table inet tenancy\n"));
        let mut out = Vec::new();
        show_to(
            &spec,
            &ShowArgs {
                format: Format::Table,
                rules: true,
            },
            &mut out,
        )
        .unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("ip daddr 10.1.0.0/16 accept"));
        let r = rows(&spec, false).unwrap();
        let mut out = Vec::new();
        print_rows(&mut out, &spec, &r, Format::Csv).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "tenant,id,cgroup,egress,drop_packets,drop_bytes\nacme,1,\"level 2 \"\"unified/tenancy/acme\"\"\",10.1.0.0/16/any,-,-\n"
        );
    }
}
