//! One module per subcommand.

pub mod decode;
pub mod devinfo;
