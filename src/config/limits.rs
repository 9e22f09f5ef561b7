//! Evaluation budgets. A definition folder can come from a pull request nobody has read yet, so
//! `validate` and `plan` must finish in bounded time and memory whatever it says. The limits are
//! far above what a real deployment needs (see docs/limits.md) and every refusal names the
//! expression that hit it.

use std::cell::Cell;

use hcl::Value;

/// The longest string one expression may produce, in bytes.
pub const MAX_STRING_BYTES: usize = 16 << 20;
/// The most elements one list, set or map may hold.
pub const MAX_ELEMENTS: usize = 1_000_000;
/// Bytes and elements that one load may produce, counted at every function result, reference
/// and `for` collection: bounds memory and copying even when each value is under its limit.
pub const MAX_WORK: u64 = 256 << 20;
/// Loop iterations, function calls, references and operations of one load.
pub const MAX_STEPS: u64 = 4_000_000;
/// Instances one `for_each` may make.
pub const MAX_INSTANCES: usize = 10_000;
/// The largest file `file()` reads.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// Set to `1` to let `file()` read files outside the folder of the module that calls it.
pub const FILE_ANYWHERE_ENV: &str = "SPARKFORM_FILE_OUTSIDE_MODULE";

thread_local! {
    // Evaluation runs on the loading thread only, so a thread-local counts one load.
    static USED: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Counts one load's work from `begin` until it is dropped, so loads in one thread (tests, a
/// long-lived process) do not share a budget.
pub struct Budget(());

impl Budget {
    pub fn begin() -> Budget {
        USED.with(|u| u.set((0, 0)));
        Budget(())
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        USED.with(|u| u.set((0, 0)));
    }
}

const HINT: &str = "see docs/limits.md";

/// Human size for messages: `17 MiB`, `1.5 KiB`, `12 bytes`.
pub fn size_text(n: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let f = n as f64;
    if n >= 1 << 20 {
        format!("{:.0} MiB", f / f64::from(1u32 << 20))
    } else if n >= 1 << 10 {
        format!("{:.0} KiB", f / 1024.0)
    } else {
        format!("{n} bytes")
    }
}

/// Refuse a string of `bytes` before it is built.
pub fn check_string(what: &str, bytes: usize) -> Result<(), String> {
    if bytes > MAX_STRING_BYTES {
        return Err(format!(
            "{what}: the result would be a string of {} (the limit is {}; {HINT})",
            if bytes >= 2 * MAX_STRING_BYTES {
                size_text(bytes as u64)
            } else {
                format!("{bytes} bytes")
            },
            size_text(MAX_STRING_BYTES as u64)
        ));
    }
    Ok(())
}

/// Refuse a collection of `n` elements before it is built.
pub fn check_elements(what: &str, n: usize) -> Result<(), String> {
    if n > MAX_ELEMENTS {
        return Err(format!(
            "{what}: the result would have more than {MAX_ELEMENTS} elements ({HINT})"
        ));
    }
    Ok(())
}

/// Refuse a `for_each` value with more than [`MAX_INSTANCES`] elements.
pub fn check_instances(v: &Value) -> Result<(), String> {
    let n = match v {
        Value::Array(a) => a.len(),
        Value::Object(o) => o.len(),
        _ => 0,
    };
    if n > MAX_INSTANCES {
        return Err(format!(
            "for_each has {n} elements; one block makes at most {MAX_INSTANCES} instances ({HINT})"
        ));
    }
    Ok(())
}

/// Count `steps` loop iterations, calls or operations.
pub fn charge_steps(what: &str, steps: u64) -> Result<(), String> {
    charge(what, 0, steps)
}

fn charge(what: &str, work: u64, steps: u64) -> Result<(), String> {
    let (w, s) = USED.with(Cell::get);
    let (w, s) = (w.saturating_add(work), s.saturating_add(steps));
    USED.with(|u| u.set((w, s)));
    if w > MAX_WORK {
        return Err(format!(
            "{what}: the configuration produced more than {} of values in total (the evaluation limit; {HINT})",
            size_text(MAX_WORK)
        ));
    }
    if s > MAX_STEPS {
        return Err(format!(
            "{what}: the configuration needs more than {MAX_STEPS} evaluation steps (loop iterations, calls and references; {HINT})"
        ));
    }
    Ok(())
}

/// Check every string and collection inside `v` against its limit and charge its size (bytes of
/// strings and keys, one per element) plus `steps`.
pub fn admit(what: &str, v: &Value, steps: u64) -> Result<(), String> {
    let mut weight = 0u64;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        weight += 1;
        match v {
            Value::String(s) => {
                check_string(what, s.len())?;
                weight += s.len() as u64;
            }
            Value::Array(a) => {
                check_elements(what, a.len())?;
                stack.extend(a.iter());
            }
            Value::Object(o) => {
                check_elements(what, o.len())?;
                for (k, v) in o {
                    weight += k.len() as u64;
                    stack.push(v);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
        // Stop walking a value already past the budget: the walk itself is work.
        if weight > MAX_WORK {
            break;
        }
    }
    charge(what, weight, steps)
}

/// Whether `file()` may read outside the module folder.
pub fn file_anywhere() -> bool {
    std::env::var(FILE_ANYWHERE_ENV).is_ok_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_count_per_load_and_refuse_past_the_limit() {
        {
            let _b = Budget::begin();
            assert!(charge_steps("x", MAX_STEPS).is_ok());
            let e = charge_steps("`range(9)`", 1).unwrap_err();
            assert!(e.contains("`range(9)`") && e.contains("steps"), "{e}");
        }
        let _b = Budget::begin();
        assert!(charge_steps("x", 10).is_ok(), "a new load starts from zero");
    }

    #[test]
    fn admit_checks_nested_strings_and_lengths() {
        let _b = Budget::begin();
        let big = Value::Array(vec![Value::String("a".repeat(MAX_STRING_BYTES + 1))]);
        let e = admit("`local.x`", &big, 1).unwrap_err();
        assert!(
            e.contains("`local.x`") && e.contains("16777217 bytes"),
            "{e}"
        );
        let long = Value::Array(vec![Value::Null; MAX_ELEMENTS + 1]);
        assert!(admit("l", &long, 1).unwrap_err().contains("elements"));
        assert!(admit("ok", &Value::from("fine"), 1).is_ok());
    }

    #[test]
    fn total_work_is_bounded() {
        let _b = Budget::begin();
        let chunk = Value::String("a".repeat(MAX_STRING_BYTES));
        let mut last = Ok(());
        for _ in 0..(MAX_WORK / MAX_STRING_BYTES as u64 + 1) {
            last = admit("`local.chunk`", &chunk, 1);
            if last.is_err() {
                break;
            }
        }
        assert!(last.unwrap_err().contains("in total"));
    }
}
