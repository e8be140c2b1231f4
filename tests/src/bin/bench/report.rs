//! How a figure is printed: the ratios against each peer first (above 1:
//! ours is better), then every target's absolute value with the relay's
//! CPU per operation, the load generator's own CPU, and every refusal,
//! timeout and missing answer of its rounds. A figure with any of those is
//! marked INCOMPLETE, and no ratio is printed that uses it (the line says
//! which side was incomplete instead).

use std::fmt;

/// What went wrong during a figure's rounds, summed over the rounds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    /// `OK false`, `CLOSED`, or an HTTP refusal: the relay said no.
    pub refused: usize,
    /// Requests that got no answer in time (the bench's 30 s bound).
    pub timed_out: usize,
    /// REQs that never ended their stored results with EOSE.
    pub no_eose: usize,
    /// Events or deliveries that never reached the client expecting them.
    pub missing: usize,
}

impl Faults {
    pub fn is_clean(&self) -> bool {
        *self == Faults::default()
    }

    pub fn add(&mut self, other: Faults) {
        self.refused += other.refused;
        self.timed_out += other.timed_out;
        self.no_eose += other.no_eose;
        self.missing += other.missing;
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [
            (self.refused, "refused"),
            (self.timed_out, "timed out"),
            (self.no_eose, "without EOSE"),
            (self.missing, "missing"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        write!(f, "{}", parts.join(", "))
    }
}

/// One target's value of a figure: the median over rounds.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub value: f64,
    /// Relay CPU (its process, and its database's for ours on
    /// PostgreSQL) per operation, in microseconds; `None` when the
    /// relay is not a local process the bench can read.
    pub cpu_us: Option<f64>,
    /// The bench process's CPU over the figure's wall time, in cores:
    /// near the machine's core count, the generator is the limit.
    pub generator_cores: f64,
    pub faults: Faults,
}

/// Medians over rounds of a figure's samples, and the sum of their faults.
#[derive(Debug, Default)]
pub struct Rounds {
    values: Vec<f64>,
    cpu_us: Vec<f64>,
    generator_cores: Vec<f64>,
    faults: Faults,
}

impl Rounds {
    pub fn push(&mut self, value: f64, cpu_us: Option<f64>, generator_cores: f64, faults: Faults) {
        self.values.push(value);
        self.cpu_us.extend(cpu_us);
        self.generator_cores.push(generator_cores);
        self.faults.add(faults);
    }

    pub fn measured(&self) -> Measured {
        Measured {
            value: median(self.values.clone()),
            cpu_us: (!self.cpu_us.is_empty()).then(|| median(self.cpu_us.clone())),
            generator_cores: median(self.generator_cores.clone()),
            faults: self.faults,
        }
    }
}

/// Which way a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// Prints one figure: `names[0]` is ours, the rest are peers; `per` names
/// the operation CPU is counted per ("event", "REQ").
pub fn report(figure: &str, unit: &str, better: Better, per: &str, names: &[String], m: &[Measured]) {
    assert_eq!(names.len(), m.len(), "a name for every target");
    let ours = m[0];
    let ratios: Vec<String> = names
        .iter()
        .zip(m)
        .skip(1)
        .map(|(name, p)| {
            // A ratio of a figure some of whose work failed would compare
            // unlike things: say which side is incomplete instead.
            let incomplete: Vec<&str> = [(names[0].as_str(), &ours), (name.as_str(), p)]
                .iter()
                .filter(|(_, v)| !v.faults.is_clean())
                .map(|(n, _)| *n)
                .collect();
            if !incomplete.is_empty() {
                return format!("vs {name}: no ratio ({} INCOMPLETE)", incomplete.join(", "));
            }
            let ratio = match better {
                Better::Higher => ours.value / p.value,
                Better::Lower => p.value / ours.value,
            };
            format!("vs {name} {ratio:.2}x")
        })
        .collect();
    let values: Vec<String> = names
        .iter()
        .zip(m)
        .map(|(n, v)| absolute(n, v, unit, per))
        .collect();
    let head = if ratios.is_empty() {
        String::new()
    } else {
        format!("{} | ", ratios.join(", "))
    };
    println!("{figure}: {head}{}", values.join("; "));
}

fn absolute(name: &str, v: &Measured, unit: &str, per: &str) -> String {
    let cpu = v
        .cpu_us
        .map_or(String::new(), |us| format!(", relay CPU {us:.0} µs/{per}"));
    let faults = if v.faults.is_clean() {
        String::new()
    } else {
        format!(" INCOMPLETE: {}", v.faults)
    };
    format!(
        "{name} {:.1} {unit} (generator {:.2} cores{cpu}){faults}",
        v.value, v.generator_cores
    )
}

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// The order in which `targets` targets run in round `round`: forwards in
/// even rounds, backwards in odd ones (A B, B A, A B ...). Whatever one
/// target leaves behind when its turn ends (its WAL checkpoint, the
/// kernel's writeback of its files) falls on the next target's
/// measurement; alternating puts it on each target in turn, not always
/// on the second.
pub fn turn_order(round: usize, targets: usize) -> impl Iterator<Item = usize> {
    let backwards = round % 2 == 1;
    (0..targets).map(move |i| if backwards { targets - 1 - i } else { i })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_alternate_so_each_target_follows_the_other_as_often() {
        let order = |round| turn_order(round, 2).collect::<Vec<_>>();
        assert_eq!(order(0), [0, 1]);
        assert_eq!(order(1), [1, 0]);
        assert_eq!(order(2), [0, 1]);
        let three = |round| turn_order(round, 3).collect::<Vec<_>>();
        assert_eq!(three(0), [0, 1, 2]);
        assert_eq!(three(1), [2, 1, 0]);
        assert_eq!(turn_order(5, 0).count(), 0);
    }

    #[test]
    fn every_target_runs_once_a_round() {
        for targets in 1..6 {
            for round in 0..4 {
                let mut seen: Vec<usize> = turn_order(round, targets).collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..targets).collect::<Vec<_>>());
            }
        }
    }
}
