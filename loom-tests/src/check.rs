//! The check that every `#[test]` in `loom-tests/tests/` really runs a loom
//! model: a test whose `loom::model` call was commented out (or never
//! written) runs nothing and passes, which is how one of the FIFO models
//! once went unchecked.
//!
//! The rule: the body of every function marked `#[test]` calls
//! `loom::model(...)` itself, in code — not in a comment, not in a string.
//! The source is scanned as tokens: comments (line, block, nested), string
//! literals (with escapes, raw strings) and char literals are skipped, so
//! only code counts.

/// A test function that does not call `loom::model`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmodelled {
    /// The function's name.
    pub name: String,
    /// Its line (1-based).
    pub line: usize,
}

/// `src` with every comment, string literal and char literal replaced by
/// spaces (newlines kept, so line numbers stay).
pub fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == b'/' && next == Some(b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && next == Some(b'*') {
            let mut depth = 0usize;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(next, Some(b'"') | Some(b'#')) && raw_start(b, i) {
            // r"...", r#"..."#: ends at a quote followed by as many hashes.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            j += 1; // the opening quote
            while j < b.len() {
                if b[j] == b'"'
                    && b[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == b'#')
                        .count()
                        == hashes
                {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &x in &b[i..j.min(b.len())] {
                blank(&mut out, x);
            }
            i = j;
        } else if c == b'"' {
            blank(&mut out, c);
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            if i < b.len() {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}', '"') or a lifetime ('a).
            let end = if next == Some(b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|p| i + 2 + p)
            } else {
                // One (possibly multi-byte) character, then a quote.
                let ch_len = src[i + 1..].chars().next().map_or(0, char::len_utf8);
                (b.get(i + 1 + ch_len) == Some(&b'\'')).then_some(i + 1 + ch_len)
            };
            match end {
                Some(e) => {
                    for &x in &b[i..=e] {
                        blank(&mut out, x);
                    }
                    i = e + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the `r` at `i` starts a raw string (not the end of an identifier
/// such as `for"` — impossible in Rust — or `br"`, handled alike).
fn raw_start(b: &[u8], i: usize) -> bool {
    let prev_ident =
        i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') && b[i - 1] != b'b';
    if prev_ident {
        return false;
    }
    let mut j = i + 1;
    while b.get(j) == Some(&b'#') {
        j += 1;
    }
    b.get(j) == Some(&b'"')
}

/// Every `#[test]` function of `src` whose body does not call
/// `loom::model(`.
pub fn unmodelled_tests(src: &str) -> Vec<Unmodelled> {
    let code = code_only(src);
    let squeezed = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("#[test]").map(|p| p + from) {
        from = at + "#[test]".len();
        // The function: `fn NAME`, then its body from the first `{`.
        let Some(fn_at) = find_word(&code[from..], "fn").map(|p| p + from) else {
            break;
        };
        let name: String = code[fn_at + 2..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = code[fn_at..].find('{').map(|p| p + fn_at) else {
            break;
        };
        let mut depth = 0usize;
        let mut close = code.len();
        for (k, ch) in code[open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let body = squeezed(&code[open..close]);
        if !body.contains("loom::model(") {
            found.push(Unmodelled {
                name,
                line: code[..fn_at].matches('\n').count() + 1,
            });
        }
        from = close;
    }
    found
}

fn find_word(s: &str, word: &str) -> Option<usize> {
    let b = s.as_bytes();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut from = 0;
    while let Some(p) = s[from..].find(word).map(|p| p + from) {
        let before = p == 0 || !is_ident(b[p - 1]);
        let after = b.get(p + word.len()).is_none_or(|&c| !is_ident(c));
        if before && after {
            return Some(p);
        }
        from = p + word.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_call_counts() {
        let src = "#[test]\nfn a() {\n    loom::model(|| {\n        let s = \"}\";\n    });\n}\n";
        assert!(unmodelled_tests(src).is_empty());
        // Spaces and line breaks inside the path are still a call.
        assert!(unmodelled_tests("#[test] fn b() { loom :: model (|| ()) }").is_empty());
    }

    #[test]
    fn calls_in_comments_and_strings_do_not_count() {
        let src = r##"
#[test]
fn commented() {
    // both writers meet a full ring.     loom::model(|| m());
}

#[test]
fn in_block_comment() {
    /* loom::model(|| m()); /* nested */ still comment */
}

#[test]
fn in_string() {
    let _ = "loom::model(|| m())";
    let _ = r#"loom::model("#;
}

#[test]
fn fine() {
    let c = '"'; let _l: &'static str = "x"; let q = '\'';
    loom::model(|| m(c, q));
}
"##;
        let names: Vec<String> = unmodelled_tests(src).into_iter().map(|u| u.name).collect();
        assert_eq!(names, ["commented", "in_block_comment", "in_string"]);
        assert_eq!(unmodelled_tests(src)[0].line, 3);
    }

    #[test]
    fn a_call_in_another_test_does_not_cover_this_one() {
        let src = "#[test]\nfn empty() {}\n#[test]\nfn real() { loom::model(|| ()); }\n";
        assert_eq!(
            unmodelled_tests(src),
            [Unmodelled {
                name: "empty".into(),
                line: 2
            }]
        );
    }

    /// The check itself, over this crate's models.
    #[test]
    fn every_loom_test_runs_a_model() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
        let mut files = 0;
        let mut bad = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                files += 1;
                let src = std::fs::read_to_string(&path).unwrap();
                assert!(src.contains("#[test]"), "{} has no test", path.display());
                for u in unmodelled_tests(&src) {
                    bad.push(format!("{}:{}: {}", path.display(), u.line, u.name));
                }
            }
        }
        assert!(files > 0, "no model files in {}", dir.display());
        assert!(
            bad.is_empty(),
            "#[test] functions that do not call loom::model (they would pass without checking \
             anything):\n{}",
            bad.join("\n")
        );
    }
}
