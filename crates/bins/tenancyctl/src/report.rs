//! `tenancyctl report`: its arguments, and tenancy-accounting's report, priced statement and
//! cross-check with Slurm's accounting printed (progress and warnings on stderr).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use crate::output::Format;
use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use tenancy_accounting::report::{
    aggregate_paths, parse_bound, parse_month, write_report, write_statement, GroupBy, Query,
};
use tenancy_accounting::sacct;
use tenancy_accounting::statement::{self, IntegrityInputs};
use tenancy_config::Config;

use crate::output::render;

/// `report`: the report's options, and what a statement and the cross-check add.
#[derive(clap::Args)]
pub struct ReportCmd {
    #[command(flatten)]
    base: ReportArgs,
    /// Statement: anchor file(s) (syslog or cluster.audit_anchor) the integrity line checks
    /// the chains against
    #[arg(long = "anchor", value_name = "FILE")]
    anchors: Vec<PathBuf>,
    /// Statement: take only anchors with this key's MAC (default: the config's
    /// audit_anchor_key, with --anchor)
    #[arg(long, value_name = "FILE")]
    anchor_key: Option<PathBuf>,
    /// Statement: the nodes' public keys the anchors' signatures are checked with (default:
    /// the config's audit.public_keys, with --anchor)
    #[arg(long, value_name = "FILE")]
    public_keys: Option<PathBuf>,
    /// Statement: the paths hold every node's log (a node anchored without one does not verify)
    #[arg(long)]
    all_nodes: bool,
    /// Statement with --format html: one file per tenant in this folder
    /// (statement-YYYY-MM-TENANT.html); default: every tenant in one page on stdout
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Compare with Slurm's accounting (sacct) for the period (--statement, or --since and
    /// --until): list every job where the books disagree; exit 1 if any
    #[arg(long)]
    compare_sacct: bool,
    /// With --compare-sacct: read this file of `sacct --parsable2` output (with its header)
    /// instead of running sacct
    #[arg(long, value_name = "FILE", requires = "compare_sacct")]
    sacct_file: Option<PathBuf>,
    /// With --compare-sacct: slice-hours may differ from Slurm's TRES usage by this many
    /// seconds per slice (prolog and epilog time)
    #[arg(long, default_value_t = 60, requires = "compare_sacct")]
    tolerance_seconds: u64,
}

/// Runs `tenancyctl report`: the report, a statement (`--statement`) or the cross-check
/// (`--compare-sacct`).
pub fn run(config: Option<&Path>, cmd: ReportCmd) -> anyhow::Result<ExitCode> {
    let ReportCmd { base, .. } = &cmd;
    if cmd.compare_sacct {
        let (since, until) = match (&base.statement, &base.since, &base.until) {
            (Some(m), _, _) => parse_month(m)?,
            (None, Some(s), Some(u)) => (parse_bound(s, false)?, parse_bound(u, true)?),
            _ => anyhow::bail!(
                "--compare-sacct needs a period: --statement YYYY-MM, or --since and --until"
            ),
        };
        let Some(format) = base.format.plain() else {
            anyhow::bail!("--compare-sacct prints a table, csv or json, not html");
        };
        return run_compare_sacct(
            &base.paths,
            since,
            until,
            cmd.sacct_file.as_deref(),
            cmd.tolerance_seconds,
            format,
        );
    }
    let Some(month) = &base.statement else {
        if cmd.out.is_some() || !cmd.anchors.is_empty() {
            anyhow::bail!("--out and --anchor are for --statement");
        }
        return run_report(cmd.base);
    };
    // Prices come from the config; without one the statement shows quantities only. A config
    // that is there but invalid is an error: a statement never guesses a price.
    let config = match Config::load(config) {
        Ok(c) => Some(c),
        Err(tenancy_config::ConfigError::NotFound { .. }) => None,
        Err(e) => anyhow::bail!("{e}"),
    };
    let inputs = IntegrityInputs {
        anchors: cmd.anchors.clone(),
        anchor_key: cmd.anchor_key.clone().or_else(|| {
            (!cmd.anchors.is_empty())
                .then(|| config.as_ref()?.cluster.audit_anchor_key.clone())
                .flatten()
        }),
        public_keys: cmd.public_keys.clone().or_else(|| {
            (!cmd.anchors.is_empty())
                .then(|| config.as_ref()?.audit.public_keys.clone())
                .flatten()
        }),
        all_nodes: cmd.all_nodes,
    };
    run_statement(
        config.as_ref(),
        &base.paths,
        month,
        &Query {
            tenants: base.tenant.clone(),
            users: base.user.clone(),
            nodes: base.node.clone(),
            ..Default::default()
        },
        base.format,
        cmd.out.as_deref(),
        &inputs,
    )
}

/// `report --format`: the shared table/csv/json, and html (statements only, with prices from
/// the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ReportFormat {
    #[default]
    Table,
    Csv,
    Json,
    Html,
}

impl ReportFormat {
    /// The shared format; `None` for html.
    pub fn plain(self) -> Option<Format> {
        match self {
            ReportFormat::Table => Some(Format::Table),
            ReportFormat::Csv => Some(Format::Csv),
            ReportFormat::Json => Some(Format::Json),
            ReportFormat::Html => None,
        }
    }
}

/// `tenancyctl report`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Start (inclusive): YYYY-MM-DD or RFC 3339.
    #[arg(long)]
    pub since: Option<String>,
    /// End: YYYY-MM-DD (that whole day included) or RFC 3339 (exclusive).
    #[arg(long)]
    pub until: Option<String>,
    /// Only these tenants (repeatable).
    #[arg(long)]
    pub tenant: Vec<String>,
    /// Only these users (repeatable).
    #[arg(long)]
    pub user: Vec<String>,
    /// Only these nodes (repeatable).
    #[arg(long)]
    pub node: Vec<String>,
    /// Group by (repeatable or comma list).
    #[arg(long, value_delimiter = ',', value_parser = group_by())]
    pub by: Vec<GroupBy>,
    /// Monthly per-tenant chargeback statement for YYYY-MM (sets the window, groups by
    /// tenant and profile).
    #[arg(long, value_name = "MONTH", conflicts_with_all = ["since", "until", "by"])]
    pub statement: Option<String>,
    /// Output format (html: a statement's, with --statement).
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    pub format: ReportFormat,
    /// Never show the progress indicator.
    #[arg(long)]
    pub no_progress: bool,
    /// Audit log files or folders of them.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

/// `--by`'s values: the names of [`GroupBy`].
fn group_by() -> impl clap::builder::TypedValueParser<Value = GroupBy> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(GroupBy::ALL.map(GroupBy::name))
        .map(|name| GroupBy::from_name(&name).expect("one of the possible values"))
}

/// Runs the report itself (neither `--statement` nor `--compare-sacct`).
fn run_report(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let Some(format) = args.format.plain() else {
        bail!("--format html is for statements: add --statement YYYY-MM");
    };
    let mut q = Query {
        since: args
            .since
            .as_deref()
            .map(|s| parse_bound(s, false))
            .transpose()?,
        until: args
            .until
            .as_deref()
            .map(|s| parse_bound(s, true))
            .transpose()?,
        tenants: args.tenant.clone(),
        users: args.user.clone(),
        nodes: args.node.clone(),
        by: Vec::new(),
    };
    for b in &args.by {
        if !q.by.contains(b) {
            q.by.push(*b);
        }
    }
    if let (Some(s), Some(u)) = (q.since, q.until) {
        if s >= u {
            bail!("--since {s} is not before --until {u}");
        }
    }
    let month = match &args.statement {
        Some(m) => {
            let (s, u) = parse_month(m)?;
            q.since = Some(s);
            q.until = Some(u);
            q.by = vec![GroupBy::Tenant, GroupBy::Profile];
            Some(m.clone())
        }
        None => None,
    };
    let show_progress = !args.no_progress && std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last = Instant::now();
    let mut cb = |done: u64, total: u64| {
        if last.elapsed().as_millis() >= 500 || done == total {
            last = Instant::now();
            let pct = (done * 100).checked_div(total).unwrap_or(100);
            let secs = started.elapsed().as_secs_f64().max(0.001);
            eprint!(
                "\rreport: {} / {} MiB ({pct}%), {:.0} MiB/s   ",
                done >> 20,
                total >> 20,
                (done as f64 / secs) / 1048576.0
            );
            if done == total {
                eprintln!();
            }
        }
    };
    let agg = aggregate_paths(
        &args.paths,
        q,
        if show_progress { Some(&mut cb) } else { None },
    )?;
    if agg.malformed > 0 {
        eprintln!(
            "report: warning: {} malformed line(s) skipped; run `tenancyctl audit verify`",
            agg.malformed
        );
    }
    if agg.unmatched_ends > 0 {
        eprintln!(
            "report: warning: {} job_end record(s) without a start time; their slice-hours are not counted",
            agg.unmatched_ends
        );
    }
    if agg.open_starts > 0 {
        eprintln!(
            "report: warning: {} job_start record(s) without an end (still running, or the end was not recorded); their slice-hours are not counted",
            agg.open_starts
        );
    }
    let mut out = std::io::stdout().lock();
    match month {
        Some(m) => write_statement(&mut out, &agg, &m, render(format))?,
        None => write_report(&mut out, &agg, render(format))?,
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `report --statement`: exit 0, or 1 when the logs do not verify (the statement is
/// written all the same, and says so).
fn run_statement(
    config: Option<&Config>,
    paths: &[PathBuf],
    month: &str,
    filter: &Query,
    format: ReportFormat,
    out_dir: Option<&Path>,
    inputs: &IntegrityInputs,
) -> anyhow::Result<ExitCode> {
    if out_dir.is_some() && format != ReportFormat::Html {
        bail!("--out is for --format html (one file per tenant)");
    }
    let s = statement::build(
        paths,
        month,
        filter,
        config.and_then(|c| c.billing.as_ref()),
        config.map(|c| c.cluster.name.as_str()),
        inputs,
    )?;
    if s.malformed > 0 {
        eprintln!(
            "report: warning: {} malformed line(s) skipped; run `tenancyctl audit verify`",
            s.malformed
        );
    }
    let mut out = std::io::stdout().lock();
    match format {
        ReportFormat::Html => statement::write_html(&s, out_dir, &mut out)?,
        f => statement::write_plain(&mut out, &s, render(f.plain().expect("not html")))?,
    }
    out.flush()?;
    if !s.integrity.verified {
        eprintln!("report: {}", s.integrity.sentence);
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `report --compare-sacct`: exit 0 when the books agree, 1 when anything disagrees.
fn run_compare_sacct(
    paths: &[PathBuf],
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    sacct_file: Option<&Path>,
    tolerance_seconds: u64,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let text = match sacct_file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("reading sacct output {}", f.display()))?,
        None => sacct::run_sacct(since, until)?,
    };
    let slurm = sacct::parse_sacct(&text)?;
    let c = sacct::compare(&slurm, paths, since, until, tolerance_seconds)?;
    let mut out = std::io::stdout().lock();
    match format {
        Format::Json => {
            serde_json::to_writer_pretty(&mut out, &c)?;
            writeln!(out)?;
        }
        Format::Csv => {
            let mut w = csv::Writer::from_writer(&mut out);
            w.write_record(["job_id", "node", "kind", "detail"])?;
            for x in &c.disagreements {
                w.write_record([&x.job_id.to_string(), &x.node, x.kind, &x.detail])?;
            }
            w.flush()?;
        }
        Format::Table => {
            for x in &c.disagreements {
                writeln!(
                    out,
                    "DISAGREE job {} on {}: {}: {}",
                    x.job_id, x.node, x.kind, x.detail
                )?;
            }
            writeln!(
                out,
                "compare-sacct {} .. {}: {} Slurm job(s), {} job_start record(s), {} usage \
                 figure(s) compared (tolerance {} s per slice): {}",
                c.since,
                c.until,
                c.slurm_jobs,
                c.audit_job_starts,
                c.compared_usage,
                c.tolerance_seconds,
                if c.disagreements.is_empty() {
                    "the books agree".to_string()
                } else {
                    format!("{} disagreement(s)", c.disagreements.len())
                }
            )?;
        }
    }
    out.flush()?;
    Ok(if c.disagreements.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use tenancy_test_support::audit_logs::{write_logs, Truth};

    #[test]
    fn filters_and_cli_args() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: ReportArgs,
        }
        let cli = Cli::try_parse_from([
            "report",
            "--by",
            "tenant,profile",
            "--by",
            "day",
            "--tenant",
            "acme",
            "--since",
            "2026-11-01",
            "--until",
            "2026-11-30",
            "--format",
            "csv",
            "x",
        ])
        .unwrap();
        assert_eq!(
            cli.a.by,
            vec![GroupBy::Tenant, GroupBy::Profile, GroupBy::Day]
        );
        assert!(
            Cli::try_parse_from(["report", "--statement", "2026-11", "--by", "tenant", "x"])
                .is_err()
        );
        assert_eq!(
            parse_bound("2026-11-30", true).unwrap(),
            Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()
        );

        let dir = tempfile::tempdir().unwrap();
        let truths = write_logs(dir.path(), 3, 2, 1000);
        let q = Query {
            tenants: vec!["acme".into()],
            by: vec![GroupBy::Tenant],
            ..Default::default()
        };
        let agg = aggregate_paths(&[PathBuf::from(dir.path())], q, None).unwrap();
        assert_eq!(agg.groups.len(), 1);
        let jobs = truths
            .iter()
            .filter(|t| matches!(t, Truth::Job { tenant, .. } if tenant == "acme"))
            .count() as u64;
        assert_eq!(agg.groups[&vec!["acme".to_string()]].jobs, jobs);
    }
}
