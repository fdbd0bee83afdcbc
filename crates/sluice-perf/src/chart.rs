//! PNG line charts (plotters, bitmap backend): throughput and latency over time for a run,
//! and one chart per metric with every run of a sweep side by side, like the seed's figures.
//!
//! Text is drawn with DejaVu Sans embedded in the binary (`fonts/`, via plotters' `ab_glyph`
//! feature), so charts need no system font library.

use std::ops::Range;
use std::path::Path;
use std::sync::Once;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::stats::{Percentiles, Sample};
use crate::PerfError;

/// Chart size in pixels: wide enough for a sweep of eight runs side by side.
const CHART_SIZE: (u32, u32) = (1400, 700);

static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

fn register_font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // The embedded file is a valid TrueType font; a failure would only cost labels.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// Colours that stay apart on white, for up to ten series; then they repeat.
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// A named line: (x, y) points, x in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Whether the y axis is linear from 0 or logarithmic (latencies spanning decades).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Linear,
    Log,
}

/// Draws `series` into a PNG at `path`.
///
/// # Errors
/// [`PerfError::Chart`] if the file cannot be written.
pub fn lines(
    path: &Path,
    title: &str,
    y_description: &str,
    series: &[Series],
    scale: Scale,
) -> Result<(), PerfError> {
    register_font();
    let points = series.iter().flat_map(|s| s.points.iter());
    let x_max = points.clone().map(|p| p.0).fold(1.0_f64, f64::max);
    let y_max = points.clone().map(|p| p.1).fold(0.0_f64, f64::max);
    let result = match scale {
        Scale::Linear => draw(
            path,
            title,
            y_description,
            series,
            0.0..x_max,
            0.0..(y_max * 1.1).max(1.0),
        ),
        Scale::Log => {
            let y_min = points
                .map(|p| p.1)
                .filter(|&y| y > 0.0)
                .fold(f64::INFINITY, f64::min);
            let y_min = if y_min.is_finite() { y_min / 1.5 } else { 0.01 };
            let y_max = (y_max * 1.5).max(y_min * 10.0);
            draw(
                path,
                title,
                y_description,
                series,
                0.0..x_max,
                (y_min..y_max).log_scale(),
            )
        }
    };
    result.map_err(|text| PerfError::Chart {
        path: path.to_owned(),
        text,
    })
}

fn draw<Y>(
    path: &Path,
    title: &str,
    y_description: &str,
    series: &[Series],
    x_range: Range<f64>,
    y_range: Y,
) -> Result<(), String>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let root = BitMapBackend::new(path, CHART_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(x_range, y_range)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .y_label_formatter(&|value| format_axis(*value))
        .x_desc("time (s)")
        .y_desc(y_description)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|e| e.to_string())?;
    for (index, line) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                line.points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(line.label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Axis labels without needless decimals: 120000, 2.5, 0.01.
fn format_axis(value: f64) -> String {
    if value.abs() >= 100.0 || value == value.round() {
        format!("{value:.0}")
    } else if value.abs() >= 1.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}").trim_end_matches('0').to_owned()
    }
}

/// Published, confirmed (with confirms) and consumed rates over time.
///
/// # Errors
/// [`PerfError::Chart`] if the file cannot be written.
pub fn throughput(path: &Path, title: &str, samples: &[Sample]) -> Result<(), PerfError> {
    let series = |label: &str, rate: fn(&Sample) -> f64| Series {
        label: label.to_owned(),
        points: samples.iter().map(|s| (s.time_s, rate(s))).collect(),
    };
    let mut all = vec![series("published", |s| s.published_rate)];
    if samples.iter().any(|s| s.confirmed_rate > 0.0) {
        all.push(series("confirmed", |s| s.confirmed_rate));
    }
    all.push(series("consumed", |s| s.consumed_rate));
    lines(path, title, "messages / s", &all, Scale::Linear)
}

/// The latency percentiles `pick` returns, per sample, in milliseconds on a log scale.
///
/// # Errors
/// [`PerfError::Chart`] if the file cannot be written.
pub fn latency(
    path: &Path,
    title: &str,
    samples: &[Sample],
    pick: fn(&Sample) -> Option<Percentiles>,
) -> Result<(), PerfError> {
    let series = |label: &str, value: fn(&Percentiles) -> u64| Series {
        label: label.to_owned(),
        points: samples
            .iter()
            .filter_map(|s| pick(s).map(|p| (s.time_s, value(&p) as f64 / 1000.0)))
            .collect(),
    };
    let all = [
        series("p50", |p| p.p50),
        series("p75", |p| p.p75),
        series("p95", |p| p.p95),
        series("p99", |p| p.p99),
        series("max", |p| p.max),
    ];
    lines(path, title, "latency (ms, log scale)", &all, Scale::Log)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_writes_a_png() {
        let dir = std::env::temp_dir().join(format!("sluice-perf-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let series = [
            Series {
                label: "a".into(),
                points: vec![(0.0, 1.0), (1.0, 3.0), (2.0, 2.0)],
            },
            Series {
                label: "b".into(),
                points: vec![(3.0, 0.5), (4.0, 50.0)],
            },
        ];
        for (name, scale) in [("linear.png", Scale::Linear), ("log.png", Scale::Log)] {
            let path = dir.join(name);
            lines(&path, "test", "value", &series, scale).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(&bytes[1..4], b"PNG");
        }
        // No data at all still draws empty axes.
        lines(&dir.join("empty.png"), "empty", "value", &[], Scale::Log).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
