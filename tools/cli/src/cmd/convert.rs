//! `peloton convert [RESPOOL] FILE`: a Peloton-format job or pool file in
//! the native format, on stdout, for users moving their files over.

use anyhow::Result;

use super::Outcome;
use crate::cli::PoolAndFile;
use crate::output::print_out;

pub(super) fn run(target: &PoolAndFile) -> Result<Outcome> {
    let (pool, file) = target.resolve()?;
    let text = crate::spec::convert_file(&file, pool)?;
    print_out(text.trim_end())?;
    Ok(Outcome::Success)
}
