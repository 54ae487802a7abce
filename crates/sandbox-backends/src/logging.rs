//! The log set-up every host binary shares: logs go to stderr, and only when the operator asks
//! for them, because stdout belongs to the command's output (`sandboxctl`) or to the protocol
//! (`sandbox-mcp` on stdio).

use tracing::Level;

/// Installs a logger writing to stderr at the level the environment variable `variable` names
/// (`error`, `warn`, `info`, `debug` or `trace`, as [`Level`] parses them). Installs nothing when
/// the variable is unset or names no level, or when this process already has a logger.
pub fn log_to_stderr_from_env(variable: &str) {
    let Some(level) = level_named(std::env::var(variable).ok().as_deref()) else {
        return;
    };
    // A logger installed first (a test harness's, an embedding program's) stays.
    let _ = tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::stderr)
            .finish(),
    );
}

fn level_named(value: Option<&str>) -> Option<Level> {
    value?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_is_read_from_its_name_and_anything_else_logs_nothing() {
        assert_eq!(level_named(Some("debug")), Some(Level::DEBUG));
        assert_eq!(level_named(Some("WARN")), Some(Level::WARN));
        assert_eq!(level_named(None), None);
        assert_eq!(level_named(Some("")), None);
        assert_eq!(level_named(Some("loud")), None);
    }
}
