fn main() -> std::process::ExitCode {
    let code = sparkform::cli::main();
    // A connection a task still held when the command returned ends now, not when the
    // janitor notices the exit.
    sparkform::hosts::lifetime::shutdown();
    code
}
