//! A unified diff of two texts (3 lines of context), for `changes diff`.
//! The common head and tail are cut first; what is left is matched by
//! longest common subsequence when it is small enough, else shown as one
//! replaced block (correct, only less tight).

/// A line as shown: control characters (other than tab) escaped, so a
/// file the sandbox wrote cannot rewrite the reviewer's terminal.
fn shown(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    for c in line.chars() {
        match c {
            '\t' => out.push('\t'),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if (0x80..0xa0).contains(&(c as u32))
                || matches!(c as u32, 0x200e | 0x200f | 0x202a..=0x202e | 0x2066..=0x2069) =>
            {
                out.push_str(&format!("\\u{{{:x}}}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Same(usize, usize),
    Del(usize),
    Add(usize),
}

/// The edit script from `a` to `b`.
fn script(a: &[&str], b: &[&str]) -> Vec<Op> {
    let head = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let tail = a[head..]
        .iter()
        .rev()
        .zip(b[head..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    let mut ops: Vec<Op> = (0..head).map(|i| Op::Same(i, i)).collect();
    let (n, m) = (am.len(), bm.len());
    if n * m <= 4_000_000 {
        // lcs[i][j]: the longest common subsequence of am[i..] and bm[j..].
        let mut lcs = vec![0u32; (n + 1) * (m + 1)];
        let at = |i: usize, j: usize| i * (m + 1) + j;
        for i in (0..n).rev() {
            for j in (0..m).rev() {
                lcs[at(i, j)] = if am[i] == bm[j] {
                    lcs[at(i + 1, j + 1)] + 1
                } else {
                    lcs[at(i + 1, j)].max(lcs[at(i, j + 1)])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < n || j < m {
            if i < n && j < m && am[i] == bm[j] {
                ops.push(Op::Same(head + i, head + j));
                i += 1;
                j += 1;
            } else if i < n && (j == m || lcs[at(i + 1, j)] >= lcs[at(i, j + 1)]) {
                // Removals before additions, as diff(1) shows them.
                ops.push(Op::Del(head + i));
                i += 1;
            } else {
                ops.push(Op::Add(head + j));
                j += 1;
            }
        }
    } else {
        ops.extend((0..n).map(|i| Op::Del(head + i)));
        ops.extend((0..m).map(|j| Op::Add(head + j)));
    }
    ops.extend((0..tail).map(|k| Op::Same(a.len() - tail + k, b.len() - tail + k)));
    ops
}

/// The hunks of a unified diff (no `---`/`+++` header), empty when equal.
pub fn unified(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let ops = script(&a, &b);
    const CTX: usize = 3;
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| !matches!(o, Op::Same(..)))
        .map(|(i, _)| i)
        .collect();
    let mut out = String::new();
    let mut k = 0;
    while k < changed.len() {
        // A hunk: changes closer than 2*CTX lines of sameness join.
        let start = changed[k].saturating_sub(CTX);
        let mut end = changed[k];
        while k + 1 < changed.len() && changed[k + 1] - end <= 2 * CTX {
            k += 1;
            end = changed[k];
        }
        let end = (end + CTX + 1).min(ops.len());
        let hunk = &ops[start..end];
        let (mut a0, mut b0) = (None, None);
        let (mut an, mut bn) = (0, 0);
        for o in hunk {
            match *o {
                Op::Same(i, j) => {
                    a0.get_or_insert(i);
                    b0.get_or_insert(j);
                    an += 1;
                    bn += 1;
                }
                Op::Del(i) => {
                    a0.get_or_insert(i);
                    an += 1;
                }
                Op::Add(j) => {
                    b0.get_or_insert(j);
                    bn += 1;
                }
            }
        }
        // Where a side has no line in the hunk, it starts after the
        // lines before it (0 for an empty file).
        let before = |side_a: bool| {
            ops[..start]
                .iter()
                .filter(|o| match o {
                    Op::Same(..) => true,
                    Op::Del(_) => side_a,
                    Op::Add(_) => !side_a,
                })
                .count()
        };
        let a_start = a0.map_or(before(true), |i| i + 1);
        let b_start = b0.map_or(before(false), |j| j + 1);
        out.push_str(&format!("@@ -{a_start},{an} +{b_start},{bn} @@\n"));
        for o in hunk {
            let (sign, line) = match *o {
                Op::Same(i, _) => (' ', a[i]),
                Op::Del(i) => ('-', a[i]),
                Op::Add(j) => ('+', b[j]),
            };
            out.push(sign);
            out.push_str(&shown(line));
            out.push('\n');
        }
        k += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_line_is_one_hunk_with_context() {
        let old = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
        let new = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n";
        assert_eq!(
            unified(old, new),
            "@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
        );
        assert_eq!(unified(old, old), "");
        assert_eq!(unified("", "a\n"), "@@ -0,0 +1,1 @@\n+a\n");
        assert_eq!(unified("a\n", ""), "@@ -1,1 +0,0 @@\n-a\n");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(unified("", "\x1b[2Jx\n"), "@@ -0,0 +1,1 @@\n+\\x1b[2Jx\n");
    }
}
