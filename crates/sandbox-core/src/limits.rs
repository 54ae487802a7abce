//! Transfer limits: compared, never clamped.

/// One MiB.
const MIB: u64 = 1024 * 1024;

/// Caps of one transfer direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransferLimits {
    /// Largest single file, in bytes.
    pub max_bytes_per_file: u64,
    /// Largest total of one transfer, in bytes.
    pub max_total_bytes: u64,
    /// Most files in one transfer.
    pub max_files: u64,
}

/// The spec default and the ceiling a silent backend declares: 8 MiB per file, 32 MiB total, 64 files.
pub const DEFAULT_TRANSFER_LIMITS: TransferLimits = TransferLimits {
    max_bytes_per_file: 8 * MIB,
    max_total_bytes: 32 * MIB,
    max_files: 64,
};

impl Default for TransferLimits {
    fn default() -> Self {
        DEFAULT_TRANSFER_LIMITS
    }
}

impl TransferLimits {
    /// Whether every field of `self` is at most the same field of `ceiling`.
    pub fn within(&self, ceiling: &TransferLimits) -> bool {
        self.max_bytes_per_file <= ceiling.max_bytes_per_file
            && self.max_total_bytes <= ceiling.max_total_bytes
            && self.max_files <= ceiling.max_files
    }
}

impl std::fmt::Display for TransferLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes per file, {} bytes total, {} files",
            self.max_bytes_per_file, self.max_total_bytes, self.max_files
        )
    }
}

/// Limits of both directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SandboxLimits {
    /// Host to sandbox.
    pub files_in: TransferLimits,
    /// Sandbox to host.
    pub files_out: TransferLimits,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let d = TransferLimits::default();
        assert_eq!(d.max_bytes_per_file, 8_388_608);
        assert_eq!(d.max_total_bytes, 33_554_432);
        assert_eq!(d.max_files, 64);
        assert_eq!(SandboxLimits::default().files_out, d);
    }

    #[test]
    fn within_is_fieldwise() {
        let c = TransferLimits::default();
        assert!(c.within(&c));
        for bigger in [
            TransferLimits {
                max_bytes_per_file: c.max_bytes_per_file + 1,
                ..c
            },
            TransferLimits {
                max_total_bytes: c.max_total_bytes + 1,
                ..c
            },
            TransferLimits {
                max_files: c.max_files + 1,
                ..c
            },
        ] {
            assert!(!bigger.within(&c));
            assert!(c.within(&bigger));
        }
    }
}
