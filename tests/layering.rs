//! No cycles between top-level modules: each entry of `src/lib.rs` (`spec`, `disk`, `frontend`,
//! ...) may use others only in one direction, so the crate reads as layers.
//!
//! Every file under `src/` (except `main.rs`, the binary, which sees the library as `faultline::`)
//! is scanned with comments and string literals blanked out, test code included. A reference is
//! any path that reaches another top-level module: `crate::x::...` and `super::...::x::...` in
//! `use` trees (grouped, nested, multi-line, `pub use`) and in expressions, types and attributes.
//! The test prints the module graph and, when it fails, each cycle with the file and line of
//! every dependency on it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One reference from a file to a top-level module.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ref {
    target: String,
    line: usize,
    /// The path as resolved from the source, e.g. `crate::spec::rules` for an entry of
    /// `use crate::{spec::rules, ...}`.
    path: String,
}

/// `src` with comments, string literals and char literals replaced by spaces; newlines are
/// kept so line numbers still match.
fn blank_comments_and_strings(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
            // block comments nest
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if (c[i] == 'r' || ((c[i] == 'b' || c[i] == 'c') && at(i + 1) == 'r')) && (i == 0 || !ident(c[i - 1])) && {
            // a raw string: r"..", r#".."#, br"..", cr#".."#
            let mut k = i + if c[i] == 'r' { 1 } else { 2 };
            while at(k) == '#' {
                k += 1;
            }
            at(k) == '"'
        } {
            let mut k = i + if c[i] == 'r' { 1 } else { 2 };
            let mut hashes = 0;
            while at(k) == '#' {
                hashes += 1;
                k += 1;
            }
            k += 1; // the opening quote
            while k < c.len() && !(c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#')) {
                k += 1;
            }
            let end = (k + 1 + hashes).min(c.len());
            for &ch in &c[i..end] {
                blank(&mut out, ch);
            }
            i = end;
        } else if c[i] == '"' {
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            if i < c.len() {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '\'' && (at(i + 1) == '\\' || (at(i + 1) != '\0' && at(i + 2) == '\'')) {
            // a char literal ('x', '\n', '\'', '\u{..}'); a lifetime ('a, 'static) has no closing quote
            let mut k = i + 1;
            if at(k) == '\\' {
                k += 2;
                while k < c.len() && c[k] != '\'' && c[k] != '\n' {
                    k += 1;
                }
            } else {
                k += 1;
            }
            let end = (k + 1).min(c.len());
            for &ch in &c[i..end] {
                blank(&mut out, ch);
            }
            i = end;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

fn tokenize(clean: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = clean.chars().collect();
    let mut toks = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let mut word: String = c[start..i].iter().collect();
            // a raw identifier: r#name
            if word == "r" && c.get(i) == Some(&'#') && c.get(i + 1).is_some_and(|n| n.is_alphabetic() || *n == '_') {
                let s = i + 1;
                i = s;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                word = c[s..i].iter().collect();
            }
            toks.push((Tok::Ident(word), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            toks.push((Tok::Sep, line));
            i += 2;
        } else {
            toks.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    toks
}

/// A path's segments with the line of each.
type Segs = Vec<(String, usize)>;

/// The leaves of the use tree starting at `toks[*i]`, each as its full path; stops after the
/// tree (at `,`, `}` or `;`).
fn use_tree(toks: &[(Tok, usize)], i: &mut usize, prefix: &Segs, leaves: &mut Vec<Segs>) {
    let mut segs = prefix.clone();
    if let Some((Tok::Sep, l)) = toks.get(*i) {
        // `::name`: an external crate
        segs.push(("::".into(), *l));
        *i += 1;
    }
    loop {
        match toks.get(*i) {
            Some((Tok::Ident(w), l)) => {
                segs.push((w.clone(), *l));
                *i += 1;
                if let Some((Tok::Sep, _)) = toks.get(*i) {
                    *i += 1;
                    continue;
                }
                if let Some((Tok::Ident(a), _)) = toks.get(*i)
                    && a == "as"
                {
                    *i += 2;
                }
                leaves.push(segs);
                return;
            }
            Some((Tok::Punct('*'), _)) => {
                *i += 1;
                leaves.push(segs);
                return;
            }
            Some((Tok::Punct('{'), _)) => {
                *i += 1;
                loop {
                    match toks.get(*i) {
                        None => return,
                        Some((Tok::Punct('}'), _)) => {
                            *i += 1;
                            return;
                        }
                        Some((Tok::Punct(','), _)) => *i += 1,
                        _ => {
                            let before = *i;
                            use_tree(toks, i, &segs, leaves);
                            if *i == before {
                                *i += 1; // not a tree: skip it rather than loop
                            }
                        }
                    }
                }
            }
            _ => return,
        }
    }
}

/// The top-level module a path reaches, from a file or inline module at `module` (e.g.
/// `["frontend", "uring", "abi"]`), if it is one of `tops`.
fn resolve(segs: &Segs, module: &[String], tops: &BTreeSet<String>) -> Option<(String, usize)> {
    let mut s = segs.iter().skip_while(|(w, _)| w == "self").peekable();
    let first = s.peek()?.0.clone();
    let mut base: Vec<String>;
    if first == "crate" {
        s.next();
        base = Vec::new();
    } else if first == "super" {
        base = module.to_vec();
        while s.peek().is_some_and(|(w, _)| w == "super") {
            base.pop()?;
            s.next();
        }
    } else {
        // an external crate, or a name in scope: not a module path from the crate root
        return None;
    }
    if let Some(top) = base.first() {
        let line = segs.iter().find(|(w, _)| w != "self").map(|(_, l)| *l)?;
        return Some((top.clone(), line));
    }
    let (name, line) = s.next()?;
    tops.contains(name).then(|| (name.clone(), *line))
}

/// Every reference in `src` (a file at `module`) to a top-level module other than its own.
fn references(src: &str, module: &[String], tops: &BTreeSet<String>) -> Vec<Ref> {
    let toks = tokenize(&blank_comments_and_strings(src));
    let own = module.first().cloned().unwrap_or_default();
    let mut refs = Vec::new();
    let mut inline: Vec<(String, usize)> = Vec::new(); // inline `mod name {`, with the brace depth it opened at
    let mut depth = 0usize;
    let record = |segs: &Segs, inline: &[(String, usize)], refs: &mut Vec<Ref>| {
        let mut here = module.to_vec();
        here.extend(inline.iter().map(|(n, _)| n.clone()));
        if let Some((target, line)) = resolve(segs, &here, tops)
            && target != own
        {
            let path = segs.iter().map(|(w, _)| w.as_str()).collect::<Vec<_>>().join("::");
            refs.push(Ref { target, line, path });
        }
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                i += 1;
            }
            Tok::Ident(w) if w == "mod" => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Punct('{'), _))) = (toks.get(i + 1), toks.get(i + 2)) {
                    inline.push((name.clone(), depth));
                    depth += 1;
                    i += 3;
                } else {
                    i += 1;
                }
            }
            Tok::Ident(w) if w == "use" => {
                i += 1;
                let mut leaves = Vec::new();
                use_tree(&toks, &mut i, &Vec::new(), &mut leaves);
                for l in &leaves {
                    record(l, &inline, &mut refs);
                }
                // a malformed tree: resume after it
                while i < toks.len() && toks[i].0 != Tok::Punct(';') && toks[i].0 != Tok::Punct('}') && toks[i].0 != Tok::Punct('{') {
                    i += 1;
                }
            }
            Tok::Ident(w)
                if (w == "crate" || w == "super" || w == "self")
                    && matches!(toks.get(i + 1), Some((Tok::Sep, _)))
                    && !matches!(i.checked_sub(1).and_then(|p| toks.get(p)), Some((Tok::Sep, _))) =>
            {
                // a path in an expression, type, attribute or visibility: crate::x::f(), super::super::x::T
                let mut segs = Segs::new();
                while let Some((Tok::Ident(w), l)) = toks.get(i) {
                    segs.push((w.clone(), *l));
                    i += 1;
                    if matches!(toks.get(i), Some((Tok::Sep, _))) && matches!(toks.get(i + 1), Some((Tok::Ident(_), _))) {
                        i += 1;
                    } else {
                        break;
                    }
                }
                record(&segs, &inline, &mut refs);
            }
            _ => i += 1,
        }
    }
    refs
}

/// The top-level modules declared in lib.rs (`mod x;`, `pub mod x;`, `pub(crate) mod x { .. }`).
fn top_level_modules(lib: &str) -> BTreeSet<String> {
    let toks = tokenize(&blank_comments_and_strings(lib));
    let mut depth = 0usize;
    let mut tops = BTreeSet::new();
    for (k, (t, _)) in toks.iter().enumerate() {
        match t {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => depth = depth.saturating_sub(1),
            Tok::Ident(w) if w == "mod" && depth == 0 => {
                if let Some((Tok::Ident(name), _)) = toks.get(k + 1) {
                    tops.insert(name.clone());
                }
            }
            _ => {}
        }
    }
    tops
}

/// The module path of a file under src/: `frontend/uring/mod.rs` -> `[frontend, uring]`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// An edge's evidence: `file:line path`.
type Graph = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn build_graph(src: &Path) -> (BTreeSet<String>, Graph) {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let tops = top_level_modules(&lib);
    assert!(!tops.is_empty(), "no modules found in src/lib.rs");
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph = Graph::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        if rel == Path::new("main.rs") || rel == Path::new("lib.rs") {
            continue;
        }
        let module = module_of(rel);
        if !module.first().is_some_and(|m| tops.contains(m)) {
            continue; // not part of the library (e.g. src/bin/)
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for r in references(&text, &module, &tops) {
            graph.entry(module[0].clone()).or_default().entry(r.target).or_default().push(format!("src/{}:{} {}", rel.display(), r.line, r.path));
        }
    }
    (tops, graph)
}

/// The shortest path from `from` to `to` in `graph`, both included.
fn shortest_path(graph: &Graph, from: &str, to: &str) -> Option<Vec<String>> {
    let mut prev: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([from.to_string()]);
    let mut seen = BTreeSet::from([from.to_string()]);
    while let Some(n) = queue.pop_front() {
        if n == to {
            let mut path = vec![n];
            while let Some(p) = prev.get(path.last().unwrap()) {
                path.push(p.clone());
            }
            path.reverse();
            return Some(path);
        }
        for next in graph.get(&n).into_iter().flat_map(|m| m.keys()) {
            if seen.insert(next.clone()) {
                prev.insert(next.clone(), n.clone());
                queue.push_back(next.clone());
            }
        }
    }
    None
}

/// Cycles, each as its node list (first node repeated at the end): for every edge that lies on
/// a cycle, the shortest cycle through it, without duplicates. Every dependency that closes a
/// cycle is named at least once; shortest first.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let mut found: BTreeSet<(usize, Vec<String>)> = BTreeSet::new();
    for (u, outs) in graph {
        for v in outs.keys() {
            if let Some(back) = shortest_path(graph, v, u) {
                let mut cyc = vec![u.clone()];
                cyc.extend(back); // v .. u
                // canonical rotation: start at the smallest node
                let ring = &cyc[..cyc.len() - 1];
                let start = (0..ring.len()).min_by_key(|&k| &ring[k]).unwrap();
                let mut canon: Vec<String> = ring[start..].iter().chain(&ring[..start]).cloned().collect();
                canon.push(canon[0].clone());
                found.insert((canon.len(), canon));
            }
        }
    }
    found.into_iter().map(|(_, c)| c).collect()
}

fn render_graph(tops: &BTreeSet<String>, graph: &Graph) -> String {
    let mut s = String::from("module graph (a -> b: a uses b):\n");
    for t in tops {
        let outs = graph.get(t).map(|m| m.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
        let _ = writeln!(s, "  {t} -> {}", if outs.is_empty() { "(nothing)".to_string() } else { outs.join(", ") });
    }
    s
}

fn render_cycle(graph: &Graph, cyc: &[String]) -> String {
    let evidence: Vec<&str> = cyc.windows(2).map(|w| graph[&w[0]][&w[1]][0].as_str()).collect();
    format!("cycle: {} ({})", cyc.join(" -> "), evidence.join("; "))
}

#[test]
fn no_cycles_between_top_level_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (tops, graph) = build_graph(&src);
    let text = render_graph(&tops, &graph);
    println!("{text}");
    let found = cycles(&graph);
    if !found.is_empty() {
        let mut msg = format!("{} cycle(s) between top-level modules of src/:\n", found.len());
        for c in &found {
            let _ = writeln!(msg, "{}", render_cycle(&graph, c));
        }
        let _ = write!(msg, "\n{text}");
        panic!("{msg}");
    }
}

#[cfg(test)]
mod parser {
    use super::*;

    fn tops() -> BTreeSet<String> {
        ["content", "disk", "fault", "frontend", "spec", "stack", "workload", "verify"].iter().map(|s| s.to_string()).collect()
    }

    fn refs(src: &str, module: &[&str]) -> Vec<(String, usize, String)> {
        let module: Vec<String> = module.iter().map(|s| s.to_string()).collect();
        references(src, &module, &tops()).into_iter().map(|r| (r.target, r.line, r.path)).collect()
    }

    fn r(t: &str, line: usize, path: &str) -> (String, usize, String) {
        (t.into(), line, path.into())
    }

    #[test]
    fn simple_and_pub_use() {
        let src = "use crate::fault::Rule;\npub use crate::disk::Store as S;\nuse crate::spec::units;\npub(crate) use std::io;\n";
        assert_eq!(refs(src, &["spec", "rules"]), vec![r("fault", 1, "crate::fault::Rule"), r("disk", 2, "crate::disk::Store")]);
    }

    #[test]
    fn grouped_nested_multiline_use() {
        let src = "use crate::{\n    fault::{Rule, engine::{Plan, self}},\n    disk,\n    spec::units::{self as u},\n};\n";
        assert_eq!(
            refs(src, &["frontend"]),
            vec![
                r("fault", 2, "crate::fault::Rule"),
                r("fault", 2, "crate::fault::engine::Plan"),
                r("fault", 2, "crate::fault::engine::self"),
                r("disk", 3, "crate::disk"),
                r("spec", 4, "crate::spec::units::self"),
            ]
        );
    }

    #[test]
    fn expression_type_and_attribute_paths() {
        let src = "fn f(x: crate::disk::Disk) -> Vec<crate::fault::Rule> {\n    let y = crate::spec::units::parse_size(\"1\");\n    crate::verify::run::<u8>(x)\n}\npub(in crate::content) fn g() {}\npub(crate) fn h() {}\n";
        assert_eq!(
            refs(src, &["workload", "op"]),
            vec![
                r("disk", 1, "crate::disk::Disk"),
                r("fault", 1, "crate::fault::Rule"),
                r("spec", 2, "crate::spec::units::parse_size"),
                r("verify", 3, "crate::verify::run"),
                r("content", 5, "crate::content"),
            ]
        );
    }

    #[test]
    fn comments_strings_and_chars_do_not_count() {
        let src = r####"
// use crate::disk::Disk;
/// see crate::fault::Rule
//! crate::spec
/* use crate::verify; /* nested crate::content */ still crate::fault */
fn f() -> &'static str {
    let a = "use crate::disk::Disk; \" crate::fault";
    let b = r#"crate::spec::x "quoted" "#;
    let c = br##"crate::verify"##;
    let d = '{';
    let e = '"';
    let g = '\'';
    let h = b'}';
    "crate::content"
}
fn after<'a>(x: &'a str) -> &'a str { crate::workload::go(x) }
"####;
        assert_eq!(refs(src, &["stack"]), vec![r("workload", 16, "crate::workload::go")]);
    }

    #[test]
    fn blanking_keeps_lines_and_braces() {
        let src = "a /* x\ny */ \"s\ntr\" '{' c\n";
        let out = blank_comments_and_strings(src);
        assert_eq!(out.lines().count(), src.lines().count());
        assert!(!out.contains('{') && out.contains('a') && out.contains('c'));
    }

    #[test]
    fn super_paths() {
        // from src/frontend/uring/abi.rs: super = frontend::uring, super::super = frontend, super^3 = crate
        let src = "use super::Ring;\nuse super::super::poll;\nuse super::super::super::disk::Disk;\nfn f() { super::super::super::fault::go() }\n";
        assert_eq!(
            refs(src, &["frontend", "uring", "abi"]),
            vec![r("disk", 3, "super::super::super::disk::Disk"), r("fault", 4, "super::super::super::fault::go")]
        );
        // from a top-level file (src/mem.rs), super is the crate root
        assert_eq!(refs("use super::{disk, fault::Rule};", &["mem"]), vec![r("disk", 1, "super::disk"), r("fault", 1, "super::fault::Rule")]);
        // grouped super inside super
        assert_eq!(refs("use super::{super::spec::x, y};", &["stack", "fs"]), vec![r("spec", 1, "super::super::spec::x")]);
    }

    #[test]
    fn inline_modules_count_and_deepen_super() {
        let src = "fn a() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::super::disk;\n    fn t() { crate::fault::x(); }\n}\nfn b() { super::super::verify::v() }\n";
        assert_eq!(
            refs(src, &["spec", "rules"]),
            vec![r("disk", 5, "super::super::super::disk"), r("fault", 6, "crate::fault::x"), r("verify", 8, "super::super::verify::v")]
        );
    }

    #[test]
    fn own_module_and_externals_are_not_edges() {
        let src = "use crate::spec::units;\nuse ::std::io;\nuse serde::Deserialize;\nuse self::inner::X;\nfn f() { crate::spec::x(); self::y(); }\nuse crate::Thing;\n";
        assert!(refs(src, &["spec", "rules"]).is_empty());
    }

    #[test]
    fn lib_rs_modules() {
        let lib = "//! docs mention mod fake;\npub mod a;\nmod b;\n#[cfg(test)]\npub(crate) mod c { mod d; }\npub use a::X;\n";
        assert_eq!(top_level_modules(lib), ["a", "b", "c"].iter().map(|s| s.to_string()).collect());
    }

    #[test]
    fn module_paths() {
        assert_eq!(module_of(Path::new("frontend/uring/mod.rs")), vec!["frontend", "uring"]);
        assert_eq!(module_of(Path::new("frontend/uring/abi.rs")), vec!["frontend", "uring", "abi"]);
        assert_eq!(module_of(Path::new("mem.rs")), vec!["mem"]);
    }

    #[test]
    fn cycles_are_found_and_named() {
        let mut g = Graph::new();
        let mut edge = |a: &str, b: &str| g.entry(a.into()).or_default().entry(b.into()).or_default().push(format!("src/{a}.rs:1 crate::{b}"));
        edge("a", "b");
        edge("b", "a");
        edge("b", "c");
        edge("c", "d");
        edge("d", "b");
        edge("d", "e");
        let found = cycles(&g);
        let names: Vec<String> = found.iter().map(|c| c.join(" -> ")).collect();
        assert_eq!(names, vec!["a -> b -> a", "b -> c -> d -> b"]);
        assert_eq!(render_cycle(&g, &found[0]), "cycle: a -> b -> a (src/a.rs:1 crate::b; src/b.rs:1 crate::a)");
    }
}
