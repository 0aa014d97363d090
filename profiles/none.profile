# all blocks unique (the built-in `none` profile, as a file)
0 1
