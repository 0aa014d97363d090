# measured by `faultline profile --block-size 4KiB` from: linux-source-6.1
# 78579 files, 1298681992 bytes
# blocks 362734 distinct 361327 dedup-ratio 1.0039
0 360226
1 916
2 135
3 27
4 9
5 3
6 6
7 1
8 1
9 1
14 1
15 1
