fn main() -> std::process::ExitCode {
    sparkform::cli::main()
}
