/* softmax.c — being written */
