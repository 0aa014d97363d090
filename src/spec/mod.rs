//! User-facing input and the settings it produces: units, rules, disks, stacks, workloads and
//! experiment files. Parses and validates; never does I/O beyond reading the file. The bottom
//! layer: it imports no other layer of faultline (only `content`, for block hashes), and the
//! layers consume its plain typed settings.

pub mod disk;
pub mod experiment;
pub mod host;
pub mod latency;
pub mod nbd;
pub mod net;
pub mod rule;
pub mod rules;
pub mod stack;
pub mod study;
pub mod units;
pub mod workload;

/// A YAML error of file `source`, in the form of every other input error: `SOURCE:LINE:COLUMN:
/// what is wrong, what is allowed`, then the lines around it under the file's name (the parser's
/// own first line reads `error: line L column C: ...` and its snippet names no file).
pub fn yaml_error(source: &str, e: &serde_saphyr::Error) -> String {
    let r = e.render_with_options(serde_saphyr::render_options! { source_name: Some(source) });
    let (at, head) = match e.location() {
        Some(l) => (format!("{source}:{}:{}: ", l.line(), l.column()), format!("error: line {} column {}: ", l.line(), l.column())),
        None => (format!("{source}: "), "error: ".to_string()),
    };
    let body = r.strip_prefix(&head).or_else(|| r.strip_prefix("error: ")).unwrap_or(&r);
    format!("{at}{body}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn yaml_errors_name_the_file_once_and_point_at_the_line() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct S {
            size: u64,
        }
        let e = serde_saphyr::from_str::<S>("size: 1\nsise: 2\n").unwrap_err();
        let m = super::yaml_error("exp.yaml", &e);
        assert!(m.starts_with("exp.yaml:2:1: unknown field `sise`"), "{m}");
        assert!(m.contains("--> exp.yaml:2:1"), "{m}");
        assert!(!m.contains("<input>") && !m.contains("error:"), "{m}");
    }
}
