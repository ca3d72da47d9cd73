//! `loss.png`: training (and evaluation) loss against step, drawn with plotters.

use std::path::Path;

use plotters::prelude::*;

/// Draws the loss curves to `path` (a PNG). `train` and `eval` are (step, loss) points.
/// Written to a temporary file beside it and renamed, so a kill never leaves half a PNG.
pub fn loss_plot(path: &Path, train: &[(u64, f32)], eval: &[(u64, f32)]) -> Result<(), String> {
    if train.is_empty() {
        return Ok(());
    }
    // plotters picks the image format from the extension, so the temporary name keeps it.
    let tmp = path.with_extension("tmp.png");
    draw(&tmp, train, eval)?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

fn draw(path: &Path, train: &[(u64, f32)], eval: &[(u64, f32)]) -> Result<(), String> {
    let max_step = train.iter().chain(eval).map(|p| p.0).max().unwrap_or(1).max(1);
    let finite = train.iter().chain(eval).map(|p| p.1).filter(|l| l.is_finite());
    let (lo, hi) = finite.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), l| (lo.min(l), hi.max(l)));
    let (lo, hi) = (lo.max(1e-4), hi.max(lo * 1.01 + 1e-4));
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption("fusebox training loss", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..max_step, (lo..hi).log_scale())
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc("step").y_desc("loss").draw().map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(train.iter().map(|&(s, l)| (s, l.max(lo))), &BLUE))
        .map_err(|e| e.to_string())?
        .label("train")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    if !eval.is_empty() {
        chart
            .draw_series(LineSeries::new(eval.iter().map(|&(s, l)| (s, l.max(lo))), RED.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label("eval")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE).draw().map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
