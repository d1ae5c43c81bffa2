//! `tenancyctl storage-audit`: its arguments, and the findings of tenancy-storage-audit printed
//! as a table, CSV or JSON.

use crate::output::Format;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use tenancy_storage_audit::{audit_paths, Report, TenantMap};

/// `tenancyctl storage-audit`
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// Folders to audit (e.g. the scratch root, shared dataset folders).
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Walker threads (default: number of CPUs).
    #[arg(long)]
    pub threads: Option<usize>,
    /// No progress line on stderr (it is only shown when stderr is a terminal).
    #[arg(long)]
    pub no_progress: bool,
}

fn write_report(report: &Report, format: Format, out: &mut dyn Write) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, report)?;
            writeln!(out)?;
        }
        Format::Csv => {
            let mut w = csv::Writer::from_writer(out);
            w.write_record(["rule", "tenant", "who", "perms", "path", "detail"])?;
            for f in &report.findings {
                w.write_record([
                    f.rule.name(),
                    f.tenant.as_deref().unwrap_or(""),
                    &f.who,
                    &f.perms,
                    &f.path.to_string_lossy(),
                    &f.detail,
                ])?;
            }
            w.flush()?;
        }
        Format::Table => {
            let rows: Vec<[String; 6]> = report
                .findings
                .iter()
                .map(|f| {
                    [
                        f.rule.name().into(),
                        f.tenant.clone().unwrap_or_else(|| "-".into()),
                        f.who.clone(),
                        f.perms.clone(),
                        f.path.display().to_string(),
                        f.detail.clone(),
                    ]
                })
                .collect();
            let head = ["RULE", "TENANT", "WHO", "PERMS", "PATH", "DETAIL"];
            let mut width = head.map(|h| h.len());
            for r in &rows {
                for (i, c) in r.iter().enumerate() {
                    width[i] = width[i].max(c.chars().count());
                }
            }
            let line = |cells: [&str; 6], out: &mut dyn Write| -> std::io::Result<()> {
                let mut s = String::new();
                for (i, c) in cells.iter().enumerate() {
                    if i == 5 {
                        s.push_str(c);
                    } else {
                        s.push_str(&format!("{c:<w$}  ", w = width[i]));
                    }
                }
                writeln!(out, "{}", s.trim_end())
            };
            if !rows.is_empty() {
                line(head, out)?;
                for r in &rows {
                    line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]], out)?;
                }
            }
            writeln!(
                out,
                "{} entries scanned, {} findings, {} errors",
                report.scanned,
                report.findings.len(),
                report.errors.len()
            )?;
        }
    }
    Ok(())
}

/// `tenancyctl storage-audit`: exit 1 when anything is found, 2 when nothing is found but parts
/// could not be audited, 0 when clean. Errors go to stderr.
pub fn run_storage_audit(args: &AuditArgs, tenants: &TenantMap) -> anyhow::Result<ExitCode> {
    let progress = !args.no_progress && std::io::stderr().is_terminal();
    let report = audit_paths(&args.paths, tenants, args.threads, progress)?;
    let stdout = std::io::stdout();
    let mut lock = stdout.lock();
    write_report(&report, args.format, &mut lock)?;
    for e in &report.errors {
        eprintln!("storage-audit: not audited: {e}");
    }
    Ok(report.exit_code())
}
