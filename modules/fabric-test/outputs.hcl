output "test" {
  description = "The test, for depends_on."
  value       = fabric_test.busbw
}
