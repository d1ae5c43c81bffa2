//! `tenancyctl doctor` on a terminal: its rows (a message and a remedy of a few hundred
//! characters each) wrap to the terminal's width (COLUMNS, or the tty's), while `--format csv`
//! and `--format json` keep every cell whole for scripts.

mod common;

use std::process::Command;

fn doctor(config: &std::path::Path, columns: Option<&str>, format: &str) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tenancyctl"));
    c.arg("--config")
        .arg(config)
        .args(["doctor", "--format", format]);
    match columns {
        Some(w) => c.env("COLUMNS", w),
        None => c.env_remove("COLUMNS"),
    };
    let out = c.output().unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn doctor_table_fits_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::minimal_config(dir.path());
    // Piped without COLUMNS: one line a row, as scripts grep it; some rows are long.
    let whole = doctor(&config, None, "table");
    let longest = whole.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(longest > 120, "no long row to wrap: {whole}");
    for width in [80usize, 120] {
        let table = doctor(&config, Some(&width.to_string()), "table");
        for l in table.lines() {
            assert!(
                l.chars().count() <= width,
                "a line of {} characters at COLUMNS={width}: {l:?}\n{table}",
                l.chars().count()
            );
        }
        // Nothing cut: the same characters, laid out on more lines.
        let ink = |t: &str| t.chars().filter(|c| !c.is_whitespace()).count();
        assert_eq!(ink(&table), ink(&whole), "{table}");
        assert!(table.lines().count() > whole.lines().count());
        // CSV and JSON stay whole whatever the terminal.
        let csv = doctor(&config, Some(&width.to_string()), "csv");
        assert_eq!(csv, doctor(&config, None, "csv"));
        assert!(csv.lines().any(|l| l.chars().count() > width));
        let json = doctor(&config, Some(&width.to_string()), "json");
        let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert!(rows.as_array().unwrap().len() > 3);
    }
}
