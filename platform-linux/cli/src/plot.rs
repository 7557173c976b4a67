//! `btl bench --plot FILE.svg`: latency (log-log) and bandwidth (log size,
//! linear MB/s) against message size, one curve per transport measured,
//! and — with `--compare results_raw.tsv` — the peers' curves from the
//! anchor harness (`../shared/anchors/run_anchors.sh`) beside btl's.
//!
//! Rendering uses `plotters` with only its SVG backend: no bitmap code and
//! no font library (text goes into the SVG as `<text>` elements and the
//! viewer's fonts draw it), so nothing here needs a system library.
//!
//! # The comparison file
//!
//! `run_anchors.sh` writes one tab-separated line per measurement after a
//! header: `id metric size rep value regime probe_pre_ns probe_post_ns`,
//! with `metric` one of `lat` (half round trip, µs), `bw` (windowed
//! bandwidth, MB/s) or `bwpp` (fi_pingpong's size / half round trip, which
//! is not a windowed bandwidth: not plotted). Each curve point is the
//! median of a row's repetitions at that size, whatever the placement
//! regime (filter the file first to plot one regime). The file is
//! untrusted input: every line is checked and the first bad one is an
//! error naming the file and the line.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::bench::Row;

/// One curve pair: latency and bandwidth of one transport (or one peer of
/// the comparison file) against message size.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The legend's text (`btl sm`, or the comparison file's row id).
    pub name: String,
    /// btl's own measurement (drawn thicker, with markers) or a peer's.
    pub ours: bool,
    /// (size in bytes, half round trip in µs), by size.
    pub latency: Vec<(u64, f64)>,
    /// (size in bytes, MB/s), by size.
    pub bandwidth: Vec<(u64, f64)>,
}

impl Series {
    /// btl's series for `transport` from the bench's rows.
    pub fn from_rows(transport: &str, rows: &[Row]) -> Self {
        Series {
            name: format!("btl {transport}"),
            ours: true,
            latency: rows.iter().map(|r| (r.size as u64, r.latency_us)).collect(),
            bandwidth: rows
                .iter()
                .map(|r| (r.size as u64, r.bandwidth_mbps))
                .collect(),
        }
    }
}

/// A malformed comparison file, or one that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--compare {}{}: {what}", .path.display(), AtLine(*.line))]
pub struct CompareError {
    /// The file.
    pub path: PathBuf,
    /// The line (1-based), when the problem is on one.
    pub line: Option<usize>,
    /// What is wrong.
    pub what: String,
}

/// The `:LINE` after a [`CompareError`]'s file, when it has a line.
struct AtLine(Option<usize>);

impl fmt::Display for AtLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(l) => write!(f, ":{l}"),
            None => Ok(()),
        }
    }
}

/// The columns `run_anchors.sh` starts its raw file with.
const HEADER: [&str; 5] = ["id", "metric", "size", "rep", "value"];
/// Largest comparison file read (the harness writes a few hundred lines).
const MAX_COMPARE_BYTES: u64 = 64 << 20;

/// Reads a `results_raw.tsv` of the anchor harness: one [`Series`] per row
/// id (in the order they first appear), each point the median of that
/// id's repetitions. `only`, if not empty, keeps those ids (each must be
/// in the file).
pub fn read_compare(path: &Path, only: &[String]) -> Result<Vec<Series>, CompareError> {
    let err = |line: Option<usize>, what: String| CompareError {
        path: path.to_owned(),
        line,
        what,
    };
    let len = std::fs::metadata(path)
        .map_err(|e| err(None, format!("cannot read it: {e}")))?
        .len();
    if len > MAX_COMPARE_BYTES {
        return Err(err(
            None,
            format!("{len} bytes: larger than a results file can be ({MAX_COMPARE_BYTES})"),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| err(None, format!("cannot read it: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        err(Some(line), "not UTF-8 text".into())
    })?;
    parse_compare(&text, only).map_err(|(line, what)| err(line, what))
}

/// [`read_compare`] on the file's text; errors are (line, what).
pub fn parse_compare(text: &str, only: &[String]) -> Result<Vec<Series>, (Option<usize>, String)> {
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = match lines.next() {
        Some((_, h)) => h.split('\t').collect(),
        None => return Err((None, "empty file".into())),
    };
    if header.len() < HEADER.len() || header[..HEADER.len()] != HEADER {
        return Err((
            Some(1),
            format!(
                "not the raw results of run_anchors.sh: the header should start with the \
                 columns {}, found {:?}",
                HEADER.join(", "),
                header.join(" ")
            ),
        ));
    }
    // id -> (metric, size) -> values; ids in order of appearance.
    let mut order: Vec<String> = Vec::new();
    let mut values: BTreeMap<(usize, bool, u64), Vec<f64>> = BTreeMap::new();
    for (i, line) in lines {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < HEADER.len() {
            return Err((
                Some(n),
                format!(
                    "{} column(s), expected at least {} (id, metric, size, rep, value)",
                    f.len(),
                    HEADER.len()
                ),
            ));
        }
        let id = f[0].trim();
        if id.is_empty() {
            return Err((Some(n), "empty id".into()));
        }
        let latency = match f[1] {
            "lat" => true,
            "bw" => false,
            // fi_pingpong's size / half round trip: not a windowed
            // bandwidth, so not drawn beside ours.
            "bwpp" => continue,
            m => {
                return Err((
                    Some(n),
                    format!("unknown metric {m:?} (accepts lat, bw or bwpp)"),
                ))
            }
        };
        let size: u64 = f[2]
            .parse()
            .map_err(|_| (Some(n), format!("size {:?} is not a number of bytes", f[2])))?;
        f[3].parse::<u32>().map_err(|_| {
            (
                Some(n),
                format!("repetition {:?} is not a whole number", f[3]),
            )
        })?;
        let value: f64 = f[4]
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| {
                (
                    Some(n),
                    format!("value {:?} is not a non-negative number", f[4]),
                )
            })?;
        let k = match order.iter().position(|o| o == id) {
            Some(k) => k,
            None => {
                order.push(id.to_owned());
                order.len() - 1
            }
        };
        values.entry((k, latency, size)).or_default().push(value);
    }
    if order.is_empty() {
        return Err((None, "no measurements in the file".into()));
    }
    for want in only {
        if !order.contains(want) {
            return Err((
                None,
                format!(
                    "--compare-ids: no row {want:?} in the file (it has {})",
                    order.join(", ")
                ),
            ));
        }
    }
    let mut series: Vec<Series> = order
        .iter()
        .map(|id| Series {
            name: id.clone(),
            ours: false,
            latency: Vec::new(),
            bandwidth: Vec::new(),
        })
        .collect();
    for ((k, latency, size), mut v) in values {
        let m = median(&mut v);
        let s = &mut series[k];
        if latency {
            s.latency.push((size, m));
        } else {
            s.bandwidth.push((size, m));
        }
    }
    if !only.is_empty() {
        series.retain(|s| only.contains(&s.name));
    }
    Ok(series)
}

/// The median of `v` (not empty).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `8`, `64`, `1K`, `64K`, `1M`, `4M` (powers of two shown exactly).
fn size_label(x: f64) -> String {
    let b = x.round() as u64;
    let (div, unit) = if b >= 1 << 30 && b % (1 << 30) == 0 {
        (1 << 30, "G")
    } else if b >= 1 << 20 && b % (1 << 20) == 0 {
        (1 << 20, "M")
    } else if b >= 1 << 10 && b % (1 << 10) == 0 {
        (1 << 10, "K")
    } else {
        (1, "")
    };
    format!("{}{unit}", b / div)
}

/// `0.35`, `4.2`, `120` (a value label of the y axis).
fn number_label(v: f64) -> String {
    let t = if v == 0.0 {
        "0".to_string()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    match t.strip_suffix(".0") {
        Some(i) => i.to_string(),
        None => t,
    }
}

/// Points drawable on a log axis (size and value above 0).
fn drawable(points: &[(u64, f64)], log_y: bool) -> Vec<(f64, f64)> {
    points
        .iter()
        .filter(|&&(s, v)| s > 0 && v.is_finite() && (v > 0.0 || !log_y && v >= 0.0))
        .map(|&(s, v)| (s as f64, v))
        .collect()
}

/// The range covering `vals`, widened a little (and by a factor for a log
/// axis) so that no point sits on the frame.
fn span(vals: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (lo, hi) = vals.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    if !lo.is_finite() {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        (lo / 1.5, hi * 1.5)
    } else {
        (0.0, if hi > 0.0 { hi * 1.08 } else { 1.0 })
    }
}

/// Curve colours: Tableau's ten (distinct, readable on white), then
/// plotters' 99-colour palette.
const COLORS: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (214, 39, 40),
    (44, 160, 44),
    (255, 127, 14),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

/// The colour of the `i`-th series.
fn color(i: usize) -> RGBAColor {
    match COLORS.get(i) {
        Some(&(r, g, b)) => RGBColor(r, g, b).to_rgba(),
        None => Palette99::pick(i - COLORS.len()).to_rgba(),
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Draws one panel: `pick` chooses the latency or bandwidth points.
fn panel(
    area: &Area<'_>,
    series: &[Series],
    caption: &str,
    y_desc: &str,
    log_y: bool,
    pick: fn(&Series) -> &[(u64, f64)],
) -> Result<(), String> {
    let pts: Vec<Vec<(f64, f64)>> = series.iter().map(|s| drawable(pick(s), log_y)).collect();
    let (x0, x1) = span(pts.iter().flatten().map(|p| p.0), true);
    let (y0, y1) = span(pts.iter().flatten().map(|p| p.1), log_y);
    let e = |e: DrawingAreaErrorKind<_>| format!("drawing the {caption} panel: {e}");
    // Where curves seldom go: latency rises with size (lower right is
    // free), bandwidth too (upper left is).
    let legend_at = if log_y {
        SeriesLabelPosition::LowerRight
    } else {
        SeriesLabelPosition::UpperLeft
    };
    let mut b = ChartBuilder::on(area);
    b.caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(72);
    // Ticks at the measured sizes (8, 64, 1K, ... as `btl bench` and the
    // anchors measure), or at powers of 4 when there are many.
    let mut ticks: Vec<f64> = pts.iter().flatten().map(|p| p.0).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    if ticks.len() > 16 {
        ticks = (0..32)
            .map(|k| 4f64.powi(k))
            .filter(|t| (x0..=x1).contains(t))
            .collect();
    }
    let x = (x0..x1).log_scale().with_key_points(ticks);
    // Two coordinate types (log or linear y): one drawing routine each.
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart.map_err(e)?;
            chart
                .configure_mesh()
                .x_desc("message size (bytes)")
                .y_desc(y_desc)
                .label_style(("sans-serif", 14))
                .axis_desc_style(("sans-serif", 15))
                .x_label_formatter(&|v| size_label(*v))
                .y_label_formatter(&|v| number_label(*v))
                .draw()
                .map_err(e)?;
            for (i, (s, p)) in series.iter().zip(&pts).enumerate() {
                let color = color(i);
                let width = if s.ours { 3 } else { 2 };
                chart
                    .draw_series(LineSeries::new(
                        p.iter().copied(),
                        color.stroke_width(width),
                    ))
                    .map_err(e)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width))
                    });
                // Markers: ours larger; a peer measured at one size only
                // would otherwise not show at all.
                let r = if s.ours { 4 } else { 2 };
                chart
                    .draw_series(
                        p.iter()
                            .map(|&(a, b)| Circle::new((a, b), r, color.filled())),
                    )
                    .map_err(e)?;
            }
            chart
                .configure_series_labels()
                .position(legend_at)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 16))
                .draw()
                .map_err(e)?;
        }};
    }
    if log_y {
        draw!(b.build_cartesian_2d(x, (y0..y1).log_scale()));
    } else {
        draw!(b.build_cartesian_2d(x, y0..y1));
    }
    Ok(())
}

/// The SVG text of the plot: latency (log-log) on the left, bandwidth on
/// the right, one curve per series in each, with a legend. Points at size
/// 0 (and latencies of 0) cannot sit on a log axis and are left out.
pub fn render_svg(series: &[Series], title: &str) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1400, 560)).into_drawing_area();
        let e = |e: DrawingAreaErrorKind<_>| format!("drawing the plot: {e}");
        root.fill(&WHITE).map_err(e)?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(e)?;
        let (left, right) = root.split_horizontally(700);
        panel(
            &left,
            series,
            "latency (half round trip)",
            "latency (µs)",
            true,
            |s| &s.latency,
        )?;
        panel(
            &right,
            series,
            "bandwidth (windowed)",
            "bandwidth (MB/s, 10^6 B/s)",
            false,
            |s| &s.bandwidth,
        )?;
        root.present().map_err(e)?;
    }
    Ok(svg)
}

/// Renders `series` into `path` (written whole, then renamed into place,
/// so a failed run leaves no half-written plot).
pub fn write_svg(path: &Path, series: &[Series], title: &str) -> Result<(), String> {
    let svg = render_svg(series, title)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, svg).map_err(|e| format!("--plot {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("--plot {}: {e}", path.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAW: &str = "id\tmetric\tsize\trep\tvalue\tregime\tprobe_pre_ns\tprobe_post_ns\n\
        ompi_tcp\tlat\t8\t1\t5.9\tB\t61\t62\n\
        ompi_tcp\tlat\t8\t2\t5.5\tB\t61\t62\n\
        ompi_tcp\tlat\t8\t3\t7.0\tC\t240\t241\n\
        ompi_tcp\tlat\t4194304\t1\t1200\tB\t61\t62\n\
        ompi_tcp\tbw\t4194304\t1\t2900\tB\t61\t62\n\
        ompi_tcp\tbw\t4194304\t2\t3100\tB\t61\t62\n\
        fi_tcp_msg\tlat\t8\t1\t4.9\tB\t\t\n\
        fi_tcp_msg\tbwpp\t65536\t1\t2683\tB\t\t\n\
        ucp_tcp\tlat\t8\t1\t4.2\t?\t\t\n\
        ucp_tcp\tbw\t65536\t1\t2574\t?\t\t\n";

    #[test]
    fn compare_file_gives_medians_per_row() {
        let s = parse_compare(RAW, &[]).unwrap();
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["ompi_tcp", "fi_tcp_msg", "ucp_tcp"]);
        assert_eq!(s[0].latency, vec![(8, 5.9), (4194304, 1200.0)]);
        assert_eq!(s[0].bandwidth, vec![(4194304, 3000.0)]);
        assert!(s[1].bandwidth.is_empty(), "bwpp is not plotted");
        assert!(!s[2].ours);
        let only = parse_compare(RAW, &["ucp_tcp".into()]).unwrap();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].bandwidth, vec![(65536, 2574.0)]);
        let e = parse_compare(RAW, &["nope".into()]).unwrap_err();
        assert!(
            e.1.contains("\"nope\"") && e.1.contains("ompi_tcp"),
            "{e:?}"
        );
    }

    #[test]
    fn malformed_compare_lines_are_named() {
        let hdr = "id\tmetric\tsize\trep\tvalue\n";
        let cases: [(&str, usize, &str); 7] = [
            ("size=8 latency_us=1\n", 1, "header"),
            ("a\tlat\t8\t1\n", 2, "4 column(s)"),
            ("a\tlatency\t8\t1\t2\n", 2, "unknown metric \"latency\""),
            ("a\tlat\t8\t1\t2\na\tlat\tx\t1\t2\n", 3, "size \"x\""),
            ("a\tlat\t8\tr\t2\n", 2, "repetition \"r\""),
            ("a\tlat\t8\t1\t-3\n", 2, "value \"-3\""),
            ("\tlat\t8\t1\t3\n", 2, "empty id"),
        ];
        for (body, line, what) in cases {
            let text = if body.starts_with("size=") {
                body.to_string()
            } else {
                format!("{hdr}{body}")
            };
            let (l, m) = parse_compare(&text, &[]).unwrap_err();
            assert_eq!(l, Some(line), "{body:?}: {m}");
            assert!(m.contains(what), "{body:?}: {m}");
        }
        assert_eq!(parse_compare("", &[]).unwrap_err().0, None);
        assert!(parse_compare(hdr, &[])
            .unwrap_err()
            .1
            .contains("no measurements"));
    }

    #[test]
    fn compare_errors_name_the_file_and_line() {
        let dir = std::env::temp_dir().join(format!("btl-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("raw.tsv");
        std::fs::write(&f, "id\tmetric\tsize\trep\tvalue\nx\tlat\t8\t1\tNaN\n").unwrap();
        let e = read_compare(&f, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("--compare {}:2: value \"NaN\"", f.display())),
            "{e}"
        );
        std::fs::write(&f, b"id\tmetric\tsize\trep\tvalue\n\xff\n").unwrap();
        let e = read_compare(&f, &[]).unwrap_err().to_string();
        assert!(e.ends_with(":2: not UTF-8 text"), "{e}");
        let missing = dir.join("missing.tsv");
        let e = read_compare(&missing, &[]).unwrap_err().to_string();
        assert!(e.contains("missing.tsv: cannot read it"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The contents of the SVG's `<text>` elements, trimmed.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = &t[t.find('>')? + 1..];
                Some(body[..body.find("</text>")?].trim().to_string())
            })
            .collect()
    }

    /// (stroke colour, number of points) of every `<polyline>`.
    fn polylines(svg: &str) -> Vec<(String, usize)> {
        let attr = |el: &str, name: &str| {
            let at = el.find(&format!(" {name}=\""))? + name.len() + 3;
            Some(el[at..at + el[at..].find('"')?].to_string())
        };
        svg.split("<polyline")
            .skip(1)
            .filter_map(|el| {
                let el = &el[..el.find("/>")?];
                let points = attr(el, "points")?.split_whitespace().count();
                Some((attr(el, "stroke")?, points))
            })
            .collect()
    }

    fn hex(i: usize) -> String {
        let c = color(i);
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    #[test]
    fn plot_holds_every_series() {
        let rows = [
            Row {
                size: 8,
                latency_us: 4.5,
                bandwidth_mbps: 3.0,
            },
            Row {
                size: 65536,
                latency_us: 30.0,
                bandwidth_mbps: 2500.0,
            },
            Row {
                size: 4 << 20,
                latency_us: 1100.0,
                bandwidth_mbps: 5200.0,
            },
        ];
        let mut series = vec![
            Series::from_rows("tcp", &rows),
            Series::from_rows("sm", &rows[..2]),
        ];
        series.extend(parse_compare(RAW, &[]).unwrap());
        let svg = render_svg(&series, "btl bench <test> & co").unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let texts = texts(&svg);
        assert!(
            texts.iter().any(|t| t == "btl bench &lt;test&gt; &amp; co"),
            "{texts:?}"
        );
        for t in [
            "latency (half round trip)",
            "bandwidth (windowed)",
            "4M",
            "8",
        ] {
            assert!(texts.iter().any(|x| x == t), "{t}: {texts:?}");
        }
        let lines = polylines(&svg);
        for (i, s) in series.iter().enumerate() {
            // A legend entry in each panel.
            assert_eq!(
                texts.iter().filter(|t| **t == s.name).count(),
                2,
                "{}",
                s.name
            );
            // In the series' colour: a line through its points in each panel
            // that has some, and a 2-point legend sample in each.
            let mine: Vec<usize> = lines
                .iter()
                .filter(|(c, _)| *c == hex(i))
                .map(|l| l.1)
                .collect();
            let mut want = vec![2, 2, s.latency.len()];
            if !s.bandwidth.is_empty() {
                want.push(s.bandwidth.len());
            }
            for w in want {
                let at = mine.iter().position(|&n| n == w);
                assert!(
                    at.is_some(),
                    "{}: lines {mine:?}, no {w}-point line",
                    s.name
                );
            }
        }
        // Every point is marked: ours 3 + 2 in each panel; the peers' 4
        // latencies and 2 bandwidths.
        assert_eq!(svg.matches("<circle").count(), 2 * 5 + 4 + 2);
    }

    #[test]
    fn plot_without_points_still_renders() {
        let s = Series {
            name: "btl sm".into(),
            ours: true,
            latency: vec![(0, 1.0)],
            bandwidth: vec![],
        };
        let svg = render_svg(&[s], "empty").unwrap();
        assert_eq!(texts(&svg).iter().filter(|t| *t == "btl sm").count(), 2);
    }

    #[test]
    fn size_labels() {
        let l: Vec<String> = [8.0, 100.0, 1024.0, 65536.0, 4194304.0, 1536.0]
            .into_iter()
            .map(size_label)
            .collect();
        assert_eq!(l, ["8", "100", "1K", "64K", "4M", "1536"]);
        let n: Vec<String> = [0.354, 4.0, 4.25, 1200.4, 0.0]
            .into_iter()
            .map(number_label)
            .collect();
        assert_eq!(n, ["0.35", "4", "4.2", "1200", "0"]);
    }

    #[test]
    fn compare_error_messages_exact() {
        let e = |line| CompareError {
            path: "r.tsv".into(),
            line,
            what: "bad".into(),
        };
        assert_eq!(e(Some(7)).to_string(), "--compare r.tsv:7: bad");
        assert_eq!(e(None).to_string(), "--compare r.tsv: bad");
    }
}
