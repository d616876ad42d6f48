# make test's last report: the tests that passed only on their retry
# (ctest --repeat until-pass:2), read from ctest's log of the run
# (Testing/Temporary/LastTest.log): a test whose first run failed and whose
# second passed. Prints "needed a retry: N tests", then for each one its name
# and the last lines of its first, failed run's output. A retry is a finding,
# never a silent pass.
/^[0-9]+\/[0-9]+ Test: / { sub(/^[0-9]+\/[0-9]+ Test: /, ""); name = $0; out = ""; inout = 0; next }
/^Output:$/ { inout = 1; next }
/^<end of output>$/ { inout = 0; next }
inout { if ($0 !~ /^-+$/) out = out $0 "\n"; next }
/^Test Failed/ || /^Test Not Run/ {
  if (!(name in first)) { first[name] = "failed"; failure[name] = out }
  next
}
/^Test Passed/ {
  if (first[name] == "failed" && !(name in retried)) { retried[name] = 1; order[n++] = name }
  else if (!(name in first)) first[name] = "passed"
  next
}
END {
  printf "needed a retry: %d test%s\n", n, n == 1 ? "" : "s"
  for (i = 0; i < n; i++) {
    t = order[i]
    print "retried test: " t " (its first run failed; the last lines of that run:)"
    k = split(failure[t], lines, "\n")
    for (j = (k > 16 ? k - 16 : 1); j <= k; j++) if (lines[j] != "") print "    " lines[j]
  }
}
