//! How `tenancyctl devices doctor` prints the findings (its arguments are tenancyctl's).

use crate::doctor::Finding;

/// The output formats of [`render`] (`tenancyctl --format` maps onto it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Csv,
    Json,
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Render findings.
pub fn render(findings: &[Finding], format: Format) -> serde_json::Result<String> {
    Ok(match format {
        Format::Json => serde_json::to_string_pretty(findings)?,
        Format::Csv => {
            let mut s = String::from("check,severity,message,remedy\n");
            for f in findings {
                let sev = serde_json::to_value(f.severity)?;
                s += &format!(
                    "{},{},{},{}\n",
                    csv_field(&f.check),
                    sev.as_str().unwrap_or(""),
                    csv_field(&f.message),
                    csv_field(f.remedy.as_deref().unwrap_or(""))
                );
            }
            s
        }
        Format::Table => {
            let w = findings
                .iter()
                .map(|f| f.check.len())
                .max()
                .unwrap_or(5)
                .max(5);
            let mut s = format!("{:<w$}  {:<5}  MESSAGE\n", "CHECK", "LEVEL");
            for f in findings {
                let sev = serde_json::to_value(f.severity)?;
                s += &format!(
                    "{:<w$}  {:<5}  {}\n",
                    f.check,
                    sev.as_str().unwrap_or(""),
                    f.message
                );
                if let Some(r) = &f.remedy {
                    s += &format!("{:<w$}  {:<5}  -> {}\n", "", "", r);
                }
            }
            s
        }
    })
}
