//! The run's plot: per-round ratios to the stack, their median and interval.

use plotters::prelude::*;

pub type Row = (String, Vec<(&'static str, f64, f64, f64, Vec<f64>)>);

/// One panel per workload: for each mode, its per-round ratios to the stack
/// (small dots), their median (a large dot) and its 95 % interval (a bar).
pub fn draw(path: &str, rows: &[Row]) -> Result<(), String> {
    spanprof_bench::register_plot_font()?;
    let width = 560 * rows.len().max(1) as u32;
    let root = BitMapBackend::new(path, (width, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((1, rows.len().max(1)));
    for (area, (workload, ratios)) in areas.iter().zip(rows) {
        let all = ratios
            .iter()
            .flat_map(|r| r.4.iter().copied().chain([r.2, r.3]));
        let (lo, hi) = all
            .filter(|x| x.is_finite())
            .fold((1.0f64, 1.0f64), |(a, b), x| (a.min(x), b.max(x)));
        let pad = (hi - lo).max(0.02) * 0.08;
        let title = format!("{workload}: server CPU per request / user's stack");
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(55)
            .build_cartesian_2d(-0.5f64..(ratios.len() as f64 - 0.5), (lo - pad)..(hi + pad))
            .map_err(|e| e.to_string())?;
        let names: Vec<&str> = ratios.iter().map(|r| r.0).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(ratios.len())
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 0.01 && i >= 0.0 {
                    names
                        .get(i as usize)
                        .map_or(String::new(), |s| s.to_string())
                } else {
                    String::new()
                }
            })
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(LineSeries::new(
                [(-0.5, 1.0), (ratios.len() as f64 - 0.5, 1.0)],
                BLACK.mix(0.5),
            ))
            .map_err(|e| e.to_string())?;
        for (i, (_, med, lo, hi, rounds)) in ratios.iter().enumerate() {
            let x = i as f64;
            let n = rounds.len().max(1) as f64;
            chart
                .draw_series(rounds.iter().enumerate().map(|(k, &y)| {
                    Circle::new((x - 0.2 + 0.4 * k as f64 / n, y), 2, BLUE.mix(0.4).filled())
                }))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(LineSeries::new(
                    [(x + 0.28, *lo), (x + 0.28, *hi)],
                    RED.stroke_width(3),
                ))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series([Circle::new((x + 0.28, *med), 5, RED.filled())])
                .map_err(|e| e.to_string())?;
        }
    }
    root.present().map_err(|e| e.to_string())
}
