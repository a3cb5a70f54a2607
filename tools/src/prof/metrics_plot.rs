//! Training curves from ddl-train's `--metrics` file (`ddl-prof plot`).

use std::path::Path;

use anyhow::{bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::plot::{backend_of, write_png, PlotResult};

/// The series of a training metrics file (ddl-train's `--metrics` JSON lines).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// (step, loss) of every step line.
    pub loss: Vec<(f64, f64)>,
    /// (step, images/s) of every step line.
    pub images_per_s: Vec<(f64, f64)>,
    /// (step, % of step time waiting on data = data_wait_s / (data_wait_s + compute_s +
    /// allreduce_s)).
    pub data_wait_pct: Vec<(f64, f64)>,
    /// (step, ms the forward pass waited for the previous step's reduced buckets:
    /// forward_wait_s, written under `--comm-order priority`).
    pub forward_wait_ms: Vec<(f64, f64)>,
    /// (epoch, train_loss) of every epoch line.
    pub epoch_loss: Vec<(f64, f64)>,
    /// (epoch, val top-1 in %) of epoch lines that have it.
    pub val_top1_pct: Vec<(f64, f64)>,
    /// (epoch, val top-5 in %) of epoch lines that have it.
    pub val_top5_pct: Vec<(f64, f64)>,
    /// (epoch, data_wait_frac in %) of epoch lines.
    pub epoch_data_wait_pct: Vec<(f64, f64)>,
}

/// Parses a metrics JSON-lines text: `{"type":"step",...}` lines (step, loss, images_per_s,
/// data_wait_s, compute_s, allreduce_s, forward_wait_s) and `{"type":"epoch",...}` lines (epoch, train_loss,
/// val_top1, val_top5, data_wait_frac). Blank lines and other types are ignored; a line that
/// is not JSON is an error naming its number.
pub fn parse_metrics(text: &str) -> Result<Metrics> {
    let mut m = Metrics::default();
    for (k, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("metrics line {}: not JSON", k + 1))?;
        let num = |key: &str| v.get(key).and_then(serde_json::Value::as_f64);
        match v.get("type").and_then(serde_json::Value::as_str) {
            Some("step") => {
                let Some(step) = num("step") else { continue };
                if let Some(l) = num("loss") {
                    m.loss.push((step, l));
                }
                if let Some(r) = num("images_per_s") {
                    m.images_per_s.push((step, r));
                }
                if let Some(w) = num("forward_wait_s") {
                    m.forward_wait_ms.push((step, 1e3 * w));
                }
                if let Some(w) = num("data_wait_s") {
                    let total =
                        w + num("compute_s").unwrap_or(0.0) + num("allreduce_s").unwrap_or(0.0);
                    if total > 0.0 {
                        m.data_wait_pct.push((step, 100.0 * w / total));
                    }
                }
            }
            Some("epoch") => {
                let Some(e) = num("epoch") else { continue };
                if let Some(l) = num("train_loss") {
                    m.epoch_loss.push((e, l));
                }
                if let Some(a) = num("val_top1") {
                    m.val_top1_pct.push((e, 100.0 * a));
                }
                if let Some(a) = num("val_top5") {
                    m.val_top5_pct.push((e, 100.0 * a));
                }
                if let Some(f) = num("data_wait_frac") {
                    m.epoch_data_wait_pct.push((e, 100.0 * f));
                }
            }
            _ => {}
        }
    }
    Ok(m)
}

/// Draws training curves (loss, val top-1/top-5, images/s, data-wait %) from the metrics
/// file `metrics` into `out` (`.svg` or `.png`); returns the parsed series.
pub fn plot_metrics(metrics: &Path, out: &Path) -> Result<Metrics> {
    let text =
        std::fs::read_to_string(metrics).with_context(|| format!("read {}", metrics.display()))?;
    let m = parse_metrics(&text).with_context(|| metrics.display().to_string())?;
    if m.loss.is_empty() && m.epoch_loss.is_empty() {
        bail!("{}: no step or epoch lines with a loss", metrics.display());
    }
    let size = (1200, 800);
    match backend_of(out)? {
        "svg" => draw_metrics(SVGBackend::new(out, size).into_drawing_area(), &m),
        _ => write_png(out, size, |area| draw_metrics(area, &m)),
    }
    .with_context(|| format!("draw {}", out.display()))?;
    Ok(m)
}

/// One panel: several named series against a shared x axis.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(&str, &[(f64, f64)])],
) -> Result<()> {
    let pts: Vec<(f64, f64)> = series.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    if pts.is_empty() {
        area.titled(&format!("{title}: no data"), ("sans-serif", 18))
            .plot()?;
        return Ok(());
    }
    let (mut x0, mut x1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (mut y0, mut y1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if x1 <= x0 {
        x0 -= 0.5;
        x1 += 0.5;
    }
    let pad = ((y1 - y0) * 0.08).max(1e-6);
    y0 -= pad;
    y1 += pad;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .plot()?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .plot()?;
    for (i, (name, s)) in series.iter().enumerate() {
        if s.is_empty() {
            continue;
        }
        let color: RGBAColor = Palette99::pick(i).to_rgba();
        let style = color.stroke_width(2);
        chart
            .draw_series(LineSeries::new(s.iter().copied(), style))
            .plot()?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        if s.len() <= 64 {
            chart
                .draw_series(s.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .plot()?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .plot()?;
    Ok(())
}

fn draw_metrics<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, m: &Metrics) -> Result<()> {
    root.fill(&WHITE).plot()?;
    let areas = root.split_evenly((2, 2));
    if m.loss.is_empty() {
        panel(
            &areas[0],
            "training loss",
            "epoch",
            "loss",
            &[("train_loss", &m.epoch_loss)],
        )?;
    } else {
        panel(
            &areas[0],
            "training loss",
            "step",
            "loss",
            &[("loss", &m.loss)],
        )?;
    }
    panel(
        &areas[1],
        "validation accuracy",
        "epoch",
        "%",
        &[
            ("val top-1", &m.val_top1_pct),
            ("val top-5", &m.val_top5_pct),
        ],
    )?;
    panel(
        &areas[2],
        "throughput",
        "step",
        "images/s",
        &[("images/s", &m.images_per_s)],
    )?;
    if !m.forward_wait_ms.is_empty() {
        let (top, bottom) = areas[3].split_vertically(400);
        data_wait_panel(&top, m)?;
        panel(
            &bottom,
            "forward waited for communication",
            "step",
            "ms",
            &[("forward wait", &m.forward_wait_ms)],
        )?;
    } else {
        data_wait_panel(&areas[3], m)?;
    }
    root.present().plot()?;
    Ok(())
}

/// The data wait per step, or per epoch when the file has no step lines with it.
fn data_wait_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, m: &Metrics) -> Result<()> {
    match m.data_wait_pct.is_empty() {
        true => panel(
            area,
            "data wait",
            "epoch",
            "% of step time",
            &[("data wait", &m.epoch_data_wait_pct)],
        ),
        false => panel(
            area,
            "data wait",
            "step",
            "% of step time",
            &[("data wait", &m.data_wait_pct)],
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_parse() {
        let text = r#"{"type":"step","step":1,"epoch":0,"loss":2.5,"lr":0.1,"images_per_s":100.0,"data_wait_s":0.1,"compute_s":0.3,"allreduce_s":0.1,"forward_wait_s":0.025}

{"type":"epoch","epoch":0,"train_loss":2.4,"val_top1":0.25,"val_top5":null,"epoch_s":3.0,"data_wait_frac":0.2}
{"type":"other"}"#;
        let m = parse_metrics(text).unwrap();
        assert_eq!(m.loss, vec![(1.0, 2.5)]);
        assert_eq!(m.data_wait_pct, vec![(1.0, 20.0)]);
        assert_eq!(m.forward_wait_ms, vec![(1.0, 25.0)]);
        assert_eq!(m.val_top1_pct, vec![(0.0, 25.0)]);
        assert!(m.val_top5_pct.is_empty());
        assert_eq!(m.epoch_data_wait_pct, vec![(0.0, 20.0)]);
        let err = parse_metrics("{\"type\":\"step\"}\nnot json").unwrap_err();
        assert!(format!("{err:#}").contains("line 2"));
    }
}
