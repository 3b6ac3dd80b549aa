//! Who is local, and the agreement (placeholder: written next).
