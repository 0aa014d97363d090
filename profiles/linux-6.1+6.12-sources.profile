# measured by `faultline profile --block-size 4KiB` from: linux-source-6.1 linux-source-6.12
# 165208 files, 2787221209 bytes
# blocks 776482 distinct 606761 dedup-ratio 1.2797
0 438944
1 166977
2 258
3 428
4 51
5 38
6 21
7 25
8 2
9 8
13 4
15 1
17 1
19 1
29 2
