package queue_test

const helperEnv = "DROVER_QUEUE_TEST_HELPER"

func runHelper(mode string) int { return 2 }
