//! One definition of "an enum with wire strings", so every vocabulary parses and prints alike.

/// Declares a fieldless enum with its wire strings, `as_str`, `ALL`, `Display` and `FromStr`.
/// `FromStr` accepts exactly the wire strings; everything else is [`ParseError::Unknown`](crate::ParseError).
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident => $wire:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every variant, in declaration (rank) order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The wire string.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $wire, )+
                }
            }

            pub(crate) fn parse_known(s: &str) -> Option<Self> {
                match s {
                    $( $wire => Some($name::$variant), )+
                    _ => None,
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// Implements `FromStr` with only the exact wire strings accepted.
macro_rules! wire_from_str {
    ($name:ident, $what:literal) => {
        impl ::std::str::FromStr for $name {
            type Err = $crate::ParseError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::parse_known(s).ok_or_else(|| $crate::ParseError::Unknown {
                    what: $what,
                    value: s.to_owned(),
                })
            }
        }
    };
}

pub(crate) use {wire_enum, wire_from_str};
