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
pub mod networked;
pub mod rule;
pub mod stack;
pub mod units;
pub mod windows;
pub mod workload;

/// The text of an input file; `what` names it in errors (`rules file`). Bytes that are not UTF-8
/// are an error at their line and column, so the user can find them.
pub fn read_text(path: &std::path::Path, what: &str) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: cannot read {what}: {e}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        let b = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let before = &b[..at];
        let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
        let start = before.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
        format!("{}:{line}:{column}: byte 0x{:02x} is not UTF-8 text; allowed: a {what} in UTF-8", path.display(), b[at])
    })
}

/// A YAML error of file `source`, in the form of every other input error: `SOURCE:LINE:COLUMN:
/// what is wrong, what is allowed`, then the lines around it under the file's name (the parser's
/// own first line reads `error: line L column C: ...` and its snippet names no file).
pub fn yaml_error(source: &str, e: &serde_saphyr::Error) -> String {
    let r = e.render_with_options(serde_saphyr::render_options! { source_name: Some(source), formatter: &Words });
    let (at, head) = match e.location() {
        Some(l) => (format!("{source}:{}:{}: ", l.line(), l.column()), format!("error: line {} column {}: ", l.line(), l.column())),
        None => (format!("{source}: "), "error: ".to_string()),
    };
    let body = r.strip_prefix(&head).or_else(|| r.strip_prefix("error: ")).unwrap_or(&r);
    format!("{at}{body}")
}

/// The parser's messages in the user's words, with what is allowed. The parser's own words name
/// Rust types without a range (`invalid u32`), parser events (`expected mapping start`,
/// `expected string scalar`) and its own API (`set DuplicateKeyPolicy in Options`,
/// `use from_str_multiple`), none of which a user can act on.
struct Words;

/// No ` at line L, column C` after a message without a snippet: `yaml_error` puts the place first.
struct NoSuffix;

impl serde_saphyr::Localizer for NoSuffix {
    fn attach_location<'a>(&self, base: std::borrow::Cow<'a, str>, _: serde_saphyr::Location) -> std::borrow::Cow<'a, str> {
        base
    }
}

impl serde_saphyr::MessageFormatter for Words {
    fn localizer(&self) -> &dyn serde_saphyr::Localizer {
        &NoSuffix
    }

    fn format_message<'a>(&self, err: &'a serde_saphyr::Error) -> std::borrow::Cow<'a, str> {
        use serde_saphyr::Error as E;
        let whole = |lo: i128, hi: u128| format!("not a whole number in range; allowed: {lo}..{hi}, without a unit");
        let m = match err {
            E::InvalidScalar { ty, .. } => match *ty {
                "u8" => whole(0, u8::MAX.into()),
                "u16" => whole(0, u16::MAX.into()),
                "u32" => whole(0, u32::MAX.into()),
                "u64" | "usize" => whole(0, u64::MAX.into()),
                "i8" => whole(i8::MIN.into(), i8::MAX as u128),
                "i16" => whole(i16::MIN.into(), i16::MAX as u128),
                "i32" => whole(i32::MIN.into(), i32::MAX as u128),
                "i64" | "isize" => whole(i64::MIN.into(), i64::MAX as u128),
                "boolean" => "not a boolean; allowed: true or false".into(),
                "floating point" => "not a number; allowed: a finite number, e.g. 0.5".into(),
                _ => return serde_saphyr::DefaultMessageFormatter.format_message(err),
            },
            E::Unexpected { expected: "mapping start", .. } => "expected a map here: `{key: value, ...}`, or `key: value` lines indented below the key".into(),
            E::Unexpected { expected: "sequence start", .. } => "expected a list here: `[a, b]`, or `- item` lines indented below the key".into(),
            E::Unexpected { expected: "string scalar", .. } => "expected a single value here (a word, number or quoted text), not a list or a map".into(),
            E::DuplicateMappingKey { key: Some(k), .. } => format!("`{k}` is given twice in this map; allowed: each key once"),
            E::DuplicateMappingKey { key: None, .. } => "a key is given twice in this map; allowed: each key once".into(),
            E::MultipleDocuments { .. } => "a second YAML document (after `---`); allowed: one document per file".into(),
            E::Eof { .. } => "the document ends where a value was expected (an empty file?)".into(),
            E::NonFiniteFloat { value, .. } => format!("`{value}` is not a finite number; allowed: a finite number, e.g. 0.5"),
            // serde's words for a value none of an untagged enum's forms takes (each of ours says
            // what it allows with `#[serde(expecting)]`), naming a Rust type
            E::Message { msg, .. } if msg.starts_with("data did not match any variant of untagged enum ") => {
                "not a value this key takes (a list or map where one value belongs, or the other way round)".into()
            }
            _ => return serde_saphyr::DefaultMessageFormatter.format_message(err),
        };
        m.into()
    }
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

    #[test]
    fn non_utf8_is_an_error_at_its_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.yaml");
        std::fs::write(&p, b"rules:\n  - {type: \xc3\xa9rror\xff}\n").unwrap();
        let e = super::read_text(&p, "rules file").unwrap_err();
        assert_eq!(e, format!("{}:2:17: byte 0xff is not UTF-8 text; allowed: a rules file in UTF-8", p.display()));
        let e = super::read_text(&dir.path().join("none"), "rules file").unwrap_err();
        assert!(e.contains("none: cannot read rules file: No such file"), "{e}");
    }

    #[test]
    fn type_errors_say_what_is_allowed() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct S {
            n: Option<u32>,
            b: Option<bool>,
            m: Option<std::collections::BTreeMap<String, u8>>,
            l: Option<Vec<u8>>,
            s: Option<String>,
        }
        let err = |y: &str| super::yaml_error("exp.yaml", &serde_saphyr::from_str::<S>(y).unwrap_err());
        for (y, want) in [
            ("n: -1\n", "exp.yaml:1:4: not a whole number in range; allowed: 0..4294967295"),
            ("n: 99999999999\n", "exp.yaml:1:4: not a whole number in range; allowed: 0..4294967295"),
            ("n: three\n", "exp.yaml:1:4: not a whole number"),
            ("n: 1\nn: 2\n", "exp.yaml:2:1: `n` is given twice in this map; allowed: each key once"),
            ("n: 1\n---\nn: 2\n", "exp.yaml:3:1: a second YAML document (after `---`); allowed: one document per file"),
            ("b: maybe\n", "exp.yaml:1:4: not a boolean; allowed: true or false"),
            ("m: word\n", "exp.yaml:1:4: expected a map here"),
            ("l: {a: 1}\n", "exp.yaml:1:4: expected a list here"),
            ("s: [a]\n", "exp.yaml:1:4: expected a single value here"),
        ] {
            let m = err(y);
            assert!(m.starts_with(want), "{y:?}: {m}");
            assert!(!m.contains("invalid u32") && !m.contains("mapping start") && !m.contains("string scalar") && !m.contains("Options"), "{m}");
        }
        // an empty document: the place once, first, and no parser position after the message
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct R {
            rules: Vec<u8>,
        }
        let m = super::yaml_error("r.yaml", &serde_saphyr::from_str::<R>("").unwrap_err());
        assert!(m.starts_with("r.yaml:1:1: the document ends") && !m.contains("at line"), "{m}");
        // a value none of an untagged enum's forms takes says what the key allows, never the
        // enum's Rust name
        let geo = super::rule::check::DiskGeometry { size: 1 << 30, block_size: 4096 };
        for (y, want) in [
            ("rules:\n  - {type: error, op: 5}\n", "r.yaml:2:23: not an op or a list of ops; allowed: read, write"),
            ("rules:\n  - {type: error, errno: 5.5}\n", "r.yaml:2:26: not a number or a word; allowed:"),
            ("rules:\n  - {type: error, probability: [1]}\n", "r.yaml:2:32: not a number or a value with its unit"),
            ("rules:\n  - {type: error, probability: .nan}\n", "r.yaml:2:32: `.nan` is not a finite number"),
        ] {
            let m = super::rule::yaml::parse_rules(y, "r.yaml", geo).unwrap_err();
            assert!(m.starts_with(want) && !m.contains("untagged") && !m.contains("policy"), "{y:?}: {m}");
        }
        for (d, want) in [("busy_poll: [1]", "not a busy-poll budget; expected 0, off"), ("rq_affinity: [1]", "allowed: auto, keep, 0, 1, 2")] {
            let y = format!("name: x\ndisk: {{{d}}}\nworkload: {{size: 1MiB}}\n");
            let m = super::experiment::parse_experiment(&y, "e.yaml").unwrap_err();
            assert!(m.starts_with("e.yaml:2:") && m.contains(want) && !m.contains("untagged"), "{d}: {m}");
        }
        let m = super::experiment::parse_experiment("name: x\nmonitor: 5\nworkload: {size: 1MiB}\n", "e.yaml").unwrap_err();
        assert!(m.starts_with("e.yaml:2:10: not a monitor setting; allowed: auto, on, off"), "{m}");
        // the others keep the parser's words
        assert!(err("n: 1\nx: 2\n").contains("unknown field `x`"));
    }
}
