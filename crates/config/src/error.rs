//! Config errors that point at the offending text: file, line, column and a caret.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// One problem found in a config file, located by byte span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
    /// The source line holding the problem, and the caret under it.
    pub excerpt: String,
}

impl Problem {
    pub(crate) fn at(
        file: &Path,
        source: &str,
        span: Option<Range<usize>>,
        message: String,
    ) -> Self {
        let span = span.unwrap_or(0..0);
        let start = span.start.min(source.len());
        let line_start = source[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = source[start..]
            .find('\n')
            .map_or(source.len(), |i| start + i);
        let line = source[..start].matches('\n').count() + 1;
        let column = source[line_start..start].chars().count() + 1;
        let text = &source[line_start..line_end];
        let width = source[start..span.end.clamp(start, line_end)]
            .chars()
            .count()
            .max(1);
        let gutter = line.to_string().len();
        let excerpt = format!(
            "{:gutter$} |\n{line} | {text}\n{:gutter$} | {}{}",
            "",
            "",
            " ".repeat(column - 1),
            "^".repeat(width),
        );
        Problem {
            file: file.to_path_buf(),
            line,
            column,
            message,
            excerpt,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}\n{}",
            self.file.display(),
            self.line,
            self.column,
            self.message,
            self.excerpt
        )
    }
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source} (set TENANCY_CONFIG or pass --config)")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no config found: tried {tried} (set TENANCY_CONFIG or pass --config)")]
    NotFound { tried: String },
    #[error("{}", render(.0))]
    Invalid(Vec<Problem>),
}

fn render(problems: &[Problem]) -> String {
    let mut out = String::new();
    for (i, p) in problems.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&p.to_string());
    }
    out
}

impl ConfigError {
    /// The located problems, empty for read errors.
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(p) => p,
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_line_and_column() {
        let src = "a = 1\nname = \"Bad\"\n";
        let start = src.find("\"Bad\"").unwrap();
        let p = Problem::at(
            Path::new("/x.toml"),
            src,
            Some(start..start + 5),
            "bad".into(),
        );
        assert_eq!((p.line, p.column), (2, 8));
        assert!(p.to_string().starts_with("/x.toml:2:8: bad"));
        assert!(p.excerpt.contains("2 | name = \"Bad\""));
        assert!(p.excerpt.ends_with("^^^^^"));
    }
}
