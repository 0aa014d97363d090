//! No cycles between top-level modules: each entry of `src/lib.rs` (`spec`, `disk`, `frontend`,
//! ...) may use others only in one direction, so the crate reads as layers.
//!
//! Every file of the library (found from lib.rs through its `mod x;` declarations; `main.rs`,
//! the binary, sees the library as `faultline::` and is left out) is scanned with comments and
//! string literals blanked out, test code included. A stray .rs file under src/ that no `mod`
//! declares is named in the output and not counted. A reference is any path that reaches
//! another top-level module: `crate::x::...` and `super::...::x::...` in `use` trees (grouped,
//! nested, multi-line, `pub use`) and in expressions, types and attributes. The test prints the
//! module graph and, when it fails, each cycle with the file and line of its dependencies, then
//! every reference along the cycles.

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
            // `use crate::x::{self}` names crate::x
            let shown = if segs.len() > 1 && segs.last().is_some_and(|(w, _)| w == "self") { &segs[..segs.len() - 1] } else { &segs[..] };
            let path = shown.iter().map(|(w, _)| w.as_str()).collect::<Vec<_>>().join("::");
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

/// The file modules a source file declares (`mod x;`; inside an inline module, `mod a { mod
/// b; }` declares `[a, b]`), as paths relative to the file's own module.
fn declared_modules(src: &str) -> Vec<Vec<String>> {
    let toks = tokenize(&blank_comments_and_strings(src));
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(w) if w == "mod" => match (toks.get(i + 1), toks.get(i + 2)) {
                (Some((Tok::Ident(name), _)), Some((Tok::Punct(';'), _))) => {
                    let mut path: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                    path.push(name.clone());
                    out.push(path);
                }
                (Some((Tok::Ident(name), _)), Some((Tok::Punct('{'), _))) => {
                    inline.push((name.clone(), depth));
                    depth += 1;
                    i += 3;
                    continue;
                }
                _ => {}
            },
            _ => {}
        }
        i += 1;
    }
    out
}

/// The library's files, found from lib.rs through `mod x;` declarations, each with its module
/// path (`src/frontend/uring/mod.rs` -> `[frontend, uring]`).
fn module_files(src: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut out = Vec::new();
    let mut todo = vec![(src.join("lib.rs"), Vec::<String>::new())];
    while let Some((file, module)) = todo.pop() {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for rel in declared_modules(&text) {
            let mut m = module.clone();
            m.extend(rel);
            let base = m.iter().fold(src.to_path_buf(), |p, s| p.join(s));
            let flat = base.with_extension("rs");
            let child = if flat.is_file() { flat } else { base.join("mod.rs") };
            // a declared file that does not exist is the compiler's to report
            if child.is_file() {
                todo.push((child, m));
            }
        }
        if !module.is_empty() {
            out.push((file, module));
        }
    }
    out.sort();
    out
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

/// The top-level modules, the graph between them, and the .rs files under src/ that are not
/// part of the library (neither in its module tree nor the binary's main.rs or src/bin/).
fn build_graph(src: &Path) -> (BTreeSet<String>, Graph, Vec<PathBuf>) {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let tops = top_level_modules(&lib);
    assert!(!tops.is_empty(), "no modules found in src/lib.rs");
    let files = module_files(src);
    let mut graph = Graph::new();
    for (f, module) in &files {
        let rel = f.strip_prefix(src).unwrap();
        let text = std::fs::read_to_string(f).unwrap();
        for r in references(&text, module, &tops) {
            graph.entry(module[0].clone()).or_default().entry(r.target).or_default().push(format!("src/{}:{} {}", rel.display(), r.line, r.path));
        }
    }
    let mut all = Vec::new();
    rust_files(src, &mut all);
    let known: BTreeSet<&PathBuf> = files.iter().map(|(f, _)| f).collect();
    let stray = all
        .into_iter()
        .filter(|f| !known.contains(f))
        .filter(|f| {
            let rel = f.strip_prefix(src).unwrap();
            rel != Path::new("lib.rs") && rel != Path::new("main.rs") && !rel.starts_with("bin")
        })
        .collect();
    (tops, graph, stray)
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

/// `cycle: a -> b -> a (first reference of a -> b; first of b -> a)`, with `(+N more)` where an
/// edge has more references.
fn render_cycle(graph: &Graph, cyc: &[String]) -> String {
    let evidence: Vec<String> = cyc
        .windows(2)
        .map(|w| {
            let refs = &graph[&w[0]][&w[1]];
            if refs.len() > 1 { format!("{} (+{} more)", refs[0], refs.len() - 1) } else { refs[0].clone() }
        })
        .collect();
    format!("cycle: {} ({})", cyc.join(" -> "), evidence.join("; "))
}

/// Every reference along the edges of `cycles`, edge by edge: what has to move to break them.
fn render_cycle_edges(graph: &Graph, cycles: &[Vec<String>]) -> String {
    let edges: BTreeSet<(&String, &String)> = cycles.iter().flat_map(|c| c.windows(2).map(|w| (&w[0], &w[1]))).collect();
    let mut s = String::from("references along the cycles:\n");
    for (a, b) in edges {
        let refs = &graph[a][b];
        let _ = writeln!(s, "  {a} -> {b} ({} reference{}):", refs.len(), if refs.len() == 1 { "" } else { "s" });
        for r in refs {
            let _ = writeln!(s, "    {r}");
        }
    }
    s
}

#[test]
fn no_cycles_between_top_level_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (tops, graph, stray) = build_graph(&src);
    let mut text = render_graph(&tops, &graph);
    for f in &stray {
        let _ = writeln!(text, "not in the module tree, not counted: {}", f.display());
    }
    println!("{text}");
    let found = cycles(&graph);
    if !found.is_empty() {
        let mut msg = format!("{} cycle(s) between top-level modules of src/:\n", found.len());
        for c in &found {
            let _ = writeln!(msg, "{}", render_cycle(&graph, c));
        }
        let _ = write!(msg, "\n{}\n{text}", render_cycle_edges(&graph, &found));
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
                r("fault", 2, "crate::fault::engine"),
                r("disk", 3, "crate::disk"),
                r("spec", 4, "crate::spec::units"),
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
    fn declared_file_modules() {
        let src = "// mod fake;\npub mod a;\n#[cfg(test)]\nmod tests;\nmod inline {\n    pub(crate) mod b;\n    fn f() { let s = \"mod c;\"; }\n}\nmod tests2 { fn t() {} }\nmod d;\n";
        let got: Vec<String> = declared_modules(src).iter().map(|p| p.join("/")).collect();
        assert_eq!(got, vec!["a", "tests", "inline/b", "d"]);
    }

    #[test]
    fn module_tree_from_lib_rs() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        let write = |rel: &str, text: &str| {
            let p = src.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("lib.rs", "pub mod a;\npub mod b;\n");
        write("a.rs", "pub mod x;\n");
        write("a/x.rs", "");
        write("b/mod.rs", "mod y;\n#[cfg(test)]\nmod tests;\n");
        write("b/y.rs", "");
        write("b/tests.rs", "");
        write("b/stale.rs", "use crate::a::x;\n");
        write("main.rs", "");
        let got: Vec<(String, String)> =
            module_files(src).into_iter().map(|(f, m)| (f.strip_prefix(src).unwrap().display().to_string(), m.join("::"))).collect();
        let want = [("a/x.rs", "a::x"), ("a.rs", "a"), ("b/mod.rs", "b"), ("b/tests.rs", "b::tests"), ("b/y.rs", "b::y")];
        assert_eq!(got, want.iter().map(|(f, m)| (f.to_string(), m.to_string())).collect::<Vec<_>>());
        let (_, graph, stray) = build_graph(src);
        assert!(graph.is_empty(), "{graph:?}");
        assert_eq!(stray, vec![src.join("b/stale.rs")]);
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
        g.get_mut("b").unwrap().get_mut("a").unwrap().push("src/b.rs:9 crate::a::x".into());
        assert_eq!(render_cycle(&g, &found[0]), "cycle: a -> b -> a (src/a.rs:1 crate::b; src/b.rs:1 crate::a (+1 more))");
        let edges = render_cycle_edges(&g, &found);
        assert!(edges.contains("  b -> a (2 references):\n    src/b.rs:1 crate::a\n    src/b.rs:9 crate::a::x\n"), "{edges}");
        assert!(!edges.contains("d -> e"), "{edges}");
    }
}
